//! Hit rate against capacity, one line per policy (see [`crate::chart`]).

use std::path::Path;

use crate::chart::{self, Axis, LineChart};

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
    let capacities = summaries.iter().map(|s| s.capacity_blocks as f64);
    let lo = capacities.clone().fold(f64::INFINITY, f64::min);
    let hi = capacities.fold(0.0, f64::max);
    if !lo.is_finite() || lo <= 0.0 {
        return Err(plot_err("nothing to plot".to_owned()));
    }
    let label = "cache capacity (blocks)";
    let x = if hi / lo >= 10.0 {
        // Half a decade of margin keeps end points off the frame.
        Axis::log(label, lo / 1.5..hi * 1.5, 0)
    } else {
        let pad = if hi > lo { (hi - lo) * 0.05 } else { lo * 0.5 };
        Axis::linear(label, (lo - pad).max(0.0)..hi + pad, 0)
    };
    let title = if trace_name.is_empty() {
        PLOT_TITLE.to_owned()
    } else {
        format!("{PLOT_TITLE} ({trace_name})")
    };
    let points = summaries.iter().map(|s| {
        let point = (s.capacity_blocks as f64, s.overall_hit_rate * 100.0);
        (s.policy.clone(), point)
    });
    LineChart {
        title,
        x,
        y: Axis::linear("overall hit rate (%)", 0.0..100.0, 0),
        series: chart::group(points),
    }
    .draw(path)
    .map_err(plot_err)
}
