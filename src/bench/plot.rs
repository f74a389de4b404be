//! p50 and p99 of `match` against client processes, one line per transport
//! and percentile (see [`crate::chart`]).

use std::path::Path;

use crate::chart::{self, Axis, LineChart};

use super::RunReport;

/// Draws the chart to `path`.
pub fn draw(path: &Path, reports: &[RunReport]) -> Result<(), String> {
    let points: Vec<_> = reports
        .iter()
        .filter_map(|r| Some((r, r.ops.get("match")?)))
        .flat_map(|(r, l)| {
            [("p50", l.p50_us), ("p99", l.p99_us)].map(|(pct, v)| {
                let point = (f64::from(r.clients), v.max(0.01));
                (format!("{} {pct}", r.transport), point)
            })
        })
        .collect();
    let max_x = points.iter().map(|(_, p)| p.0).fold(1.0, f64::max);
    let ys = points.iter().map(|(_, p)| p.1);
    let (lo, hi) = ys.fold((f64::INFINITY, 0.0f64), |(a, b), y| (a.min(y), b.max(y)));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    LineChart {
        title: format!("match round trip vs client processes ({cores} cores)"),
        x: Axis::linear("client processes", 0.5..max_x + 0.5, 0),
        y: Axis::log("latency (µs)", lo / 2.0..hi * 2.0, 1),
        series: chart::group(points),
    }
    .draw(path)
}
