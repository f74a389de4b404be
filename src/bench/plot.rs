//! p50 and p99 of `match` against client processes, one line per transport
//! and percentile, as SVG (plotters, SVG backend only).

use std::path::Path;

use plotters::prelude::*;

use super::RunReport;

/// Draws the chart to `path`.
pub fn draw(path: &Path, reports: &[RunReport]) -> Result<(), String> {
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for r in reports {
        let Some(l) = r.ops.get("match") else {
            continue;
        };
        for (pct, v) in [("p50", l.p50_us), ("p99", l.p99_us)] {
            let name = format!("{} {pct}", r.transport);
            let point = (f64::from(r.clients), v.max(0.01));
            match series.iter_mut().find(|(n, _)| *n == name) {
                Some((_, points)) => points.push(point),
                None => series.push((name, vec![point])),
            }
        }
    }
    if series.is_empty() {
        return Err("nothing to plot".into());
    }
    let max_x = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|q| q.0))
        .fold(1.0, f64::max);
    let ys = series.iter().flat_map(|(_, p)| p.iter().map(|q| q.1));
    let (lo, hi) = ys.fold((f64::INFINITY, 0.0f64), |(a, b), y| (a.min(y), b.max(y)));
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "match round trip vs client processes (2-core VM)",
            ("sans-serif", 24),
        )
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d(0.5..max_x + 0.5, (lo / 2.0..hi * 2.0).log_scale())
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("client processes")
        .y_desc("latency (µs, log scale)")
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.1}"))
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
            .draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))
            .map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE)
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}
