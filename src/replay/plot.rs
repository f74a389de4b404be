//! Hit rate against capacity as an SVG line chart (plotters, SVG backend
//! only: no system fonts or libraries; text is left to the SVG viewer).

use std::path::Path;

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;

use super::{ReplayError, Summary};

/// The chart title; the trace's file name is appended in parentheses.
pub const PLOT_TITLE: &str = "Prefix hit rate vs cache capacity";

/// Draws one line per policy of `overall_hit_rate` (as %) against
/// `capacity_blocks`, on a log x axis when the capacities span ≥ 10×.
///
/// `trace_name` goes into the title. Summaries of one policy are joined in
/// capacity order, so the input order does not matter.
pub fn draw_plot(path: &Path, summaries: &[Summary], trace_name: &str) -> Result<(), ReplayError> {
    let plot_err = |message: String| ReplayError::Plot {
        path: path.to_owned(),
        message,
    };
    let series = group_by_policy(summaries);
    let capacities = summaries.iter().map(|s| s.capacity_blocks as f64);
    let lo = capacities.clone().fold(f64::INFINITY, f64::min);
    let hi = capacities.fold(0.0, f64::max);
    if series.is_empty() || !lo.is_finite() || lo <= 0.0 {
        return Err(plot_err("nothing to plot".to_owned()));
    }
    let title = if trace_name.is_empty() {
        PLOT_TITLE.to_owned()
    } else {
        format!("{PLOT_TITLE} ({trace_name})")
    };
    let result = if hi / lo >= 10.0 {
        // Half a decade of margin keeps end points off the frame.
        draw_chart(
            path,
            &title,
            (lo / 1.5..hi * 1.5).log_scale(),
            &series,
            true,
        )
    } else {
        let pad = if hi > lo { (hi - lo) * 0.05 } else { lo * 0.5 };
        draw_chart(path, &title, (lo - pad).max(0.0)..hi + pad, &series, false)
    };
    result.map_err(plot_err)
}

/// `(policy, [(capacity, hit rate %)])`, policies in first-seen order.
fn group_by_policy(summaries: &[Summary]) -> Vec<(String, Vec<(f64, f64)>)> {
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for s in summaries {
        let point = (s.capacity_blocks as f64, s.overall_hit_rate * 100.0);
        match series.iter_mut().find(|(name, _)| *name == s.policy) {
            Some((_, points)) => points.push(point),
            None => series.push((s.policy.clone(), vec![point])),
        }
    }
    for (_, points) in &mut series {
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    series
}

fn draw_chart<X>(
    path: &Path,
    title: &str,
    x_range: X,
    series: &[(String, Vec<(f64, f64)>)],
    log_x: bool,
) -> Result<(), String>
where
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
{
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 26))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d(x_range, 0.0..100.0)
        .map_err(|e| e.to_string())?;
    let x_desc = if log_x {
        "cache capacity (blocks, log scale)"
    } else {
        "cache capacity (blocks)"
    };
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc("overall hit rate (%)")
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, (name, points)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(|e| e.to_string())?
            .label(name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(PointSeries::of_element(
                points.iter().copied(),
                4,
                color.filled(),
                &|c, s, st| Circle::new(c, s, st),
            ))
            .map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 17))
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}
