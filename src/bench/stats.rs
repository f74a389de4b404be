//! Latency samples from every worker merged into one report.

use std::collections::BTreeMap;

use super::{Latency, ReaderFigures, RunReport, Transport, WorkerReport, OPS};

fn percentile(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i] as f64 / 1e3
}

/// The figures of `samples` (nanoseconds, any order).
fn latency(mut all: Vec<u64>) -> Latency {
    all.sort_unstable();
    Latency {
        count: all.len() as u64,
        p50_us: percentile(&all, 0.5),
        p90_us: percentile(&all, 0.9),
        p99_us: percentile(&all, 0.99),
        p999_us: percentile(&all, 0.999),
    }
}

/// What `readers` reader workers saw, from their reports.
pub(super) fn reader_figures(readers: u32, reports: &[WorkerReport]) -> ReaderFigures {
    let all: Vec<u64> = reports
        .iter()
        .flat_map(|r| r.samples.get("peek").into_iter().flatten().copied())
        .collect();
    let peeks = all.len() as u64;
    let contended = reports.iter().map(|r| r.contended).sum();
    ReaderFigures {
        readers,
        peeks,
        contended,
        success: peeks as f64 / (peeks + contended).max(1) as f64,
        latency: latency(all),
    }
}

pub(super) fn merge(
    transport: Transport,
    clients: u32,
    busy_poll: bool,
    reports: &[WorkerReport],
    seconds: f64,
) -> RunReport {
    let mut ops = BTreeMap::new();
    let mut requests = 0;
    // The step's ops, then any a component adds (`alloc_state`, ...).
    let extra = reports
        .iter()
        .flat_map(|r| r.samples.keys())
        .filter(|op| !OPS.contains(&op.as_str()))
        .cloned()
        .collect::<std::collections::BTreeSet<String>>();
    for op in OPS.iter().map(|op| op.to_string()).chain(extra) {
        let op = op.as_str();
        let all: Vec<u64> = reports
            .iter()
            .flat_map(|r| r.samples.get(op).into_iter().flatten().copied())
            .collect();
        requests += all.len() as u64;
        ops.insert(op.to_owned(), latency(all));
    }
    let elapsed = reports.iter().map(|r| r.elapsed_ns as f64);
    let (fast, slow) = elapsed.fold((f64::INFINITY, 0.0f64), |(lo, hi), e| {
        (lo.min(e), hi.max(e))
    });
    let (hit, total) = reports
        .iter()
        .fold((0, 0), |(h, t), r| (h + r.hit_tokens, t + r.prompt_tokens));
    RunReport {
        transport,
        clients,
        busy_poll,
        requests,
        rejected: reports.iter().map(|r| r.rejected).sum(),
        seconds,
        requests_per_second: requests as f64 / seconds.max(1e-9),
        hit_rate: hit as f64 / total.max(1) as f64,
        fairness: if fast > 0.0 && fast.is_finite() {
            slow / fast
        } else {
            1.0
        },
        ops,
        kv_events_on: false,
        kv_events: None,
        baseline: None,
        readers: None,
    }
}
