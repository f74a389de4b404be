//! The human-readable report: one table per run, ratios between runs.

use std::io::{self, Write};

use super::{baseline, Latency, RunReport, Transport, OPS};

pub(super) fn print_table(out: &mut impl Write, r: &RunReport) -> io::Result<()> {
    let mode = if r.transport == Transport::Shm && r.busy_poll {
        " (busy-poll)"
    } else {
        ""
    };
    writeln!(
        out,
        "{}{mode}, {} client(s): {} requests ({} rejected) in {:.2} s = {:.0} req/s, hit rate {:.1}%, slowest/fastest client {:.2}",
        r.transport,
        r.clients,
        r.requests,
        r.rejected,
        r.seconds,
        r.requests_per_second,
        r.hit_rate * 100.0,
        r.fairness
    )?;
    write!(
        out,
        "  {:<7} {:>8} {:>10} {:>10} {:>10} {:>10}",
        "op", "count", "p50 µs", "p90 µs", "p99 µs", "p99.9 µs"
    )?;
    if r.baseline.is_some() {
        write!(out, " {:>14} {:>14}", "p50/ping-pong", "p50/4K copy")?;
    }
    writeln!(out)?;
    let extra = r.ops.keys().filter(|op| !OPS.contains(&op.as_str()));
    for op in OPS.iter().copied().chain(extra.map(String::as_str)) {
        if let Some(l) = r.ops.get(op) {
            write!(
                out,
                "  {op:<7} {:>8} {:>10.2} {:>10.2} {:>10.2} {:>10.2}",
                l.count, l.p50_us, l.p90_us, l.p99_us, l.p999_us
            )?;
            if let Some(b) = &r.baseline {
                write!(
                    out,
                    " {:>14} {:>14}",
                    baseline::ratio(l.p50_us, b.pingpong_p50_us),
                    baseline::ratio(l.p50_us, b.copy4k_p50_us)
                )?;
            }
            writeln!(out)?;
        }
    }
    if let Some(rd) = &r.readers {
        writeln!(
            out,
            "  peek    {:>8} {:>10.2} {:>10.2} {:>10.2} {:>10.2}  ({} reader(s), {:.3}% answered, {} contended)",
            rd.latency.count,
            rd.latency.p50_us,
            rd.latency.p90_us,
            rd.latency.p99_us,
            rd.latency.p999_us,
            rd.readers,
            rd.success * 100.0,
            rd.contended
        )?;
    }
    if r.kv_events_on && r.kv_events.is_none() {
        writeln!(out, "  kv events: on, nobody subscribed")?;
    }
    if let Some(e) = &r.kv_events {
        writeln!(
            out,
            "  kv events: {} batches, {} events received; {} gaps, {} resyncs after overflow",
            e.batches, e.events, e.gaps, e.resyncs
        )?;
    }
    if let Some(l) = r.kv_events.as_ref().and_then(|e| e.latency.as_ref()) {
        let spread = |s: &super::Spread| {
            format!(
                "p50 {:.1}, p99 {:.1}, max {:.1} µs",
                s.p50_us, s.p99_us, s.max_us
            )
        };
        writeln!(
            out,
            "  change to event ({} inserts; {} events missing, {} unpaired): {}\n    answered → batch stamped {}\n    stamped → received {}",
            l.matched,
            l.unmatched_inserts,
            l.unmatched_events,
            spread(&l.change_to_event),
            spread(&l.change_to_batch),
            spread(&l.batch_to_event)
        )?;
    }
    Ok(())
}

pub(super) fn print_event_ratios(out: &mut impl Write, pair: &[RunReport]) -> io::Result<()> {
    let [off, on] = pair else { return Ok(()) };
    let ratio = |op: &str, f: fn(&Latency) -> f64| op_ratio(on, off, op, f);
    writeln!(
        out,
        "  events on/off: match p50 {:.2}×, p99 {:.2}×; insert p50 {:.2}×, p99 {:.2}×; throughput {:.2}×\n",
        ratio("match", |l| l.p50_us),
        ratio("match", |l| l.p99_us),
        ratio("insert", |l| l.p50_us),
        ratio("insert", |l| l.p99_us),
        on.requests_per_second / off.requests_per_second.max(1e-9)
    )
}

pub(super) fn print_ratios(out: &mut impl Write, pair: &[RunReport]) -> io::Result<()> {
    let [shm, uds] = pair else { return Ok(()) };
    let ratio = |f: fn(&Latency) -> f64| op_ratio(uds, shm, "match", f);
    writeln!(
        out,
        "  uds/shm, match: p50 {:.1}×, p99 {:.1}×; throughput shm/uds {:.1}×\n",
        ratio(|l| l.p50_us),
        ratio(|l| l.p99_us),
        shm.requests_per_second / uds.requests_per_second.max(1e-9)
    )
}

/// Each operation's p50 for a rank of a group over a client alone (the
/// goal: at most 1.3).
pub(super) fn print_group_ratios(
    out: &mut impl Write,
    alone: &RunReport,
    ranks: &RunReport,
) -> io::Result<()> {
    write!(out, "  p50 per rank / alone ({} ranks):", ranks.clients)?;
    for op in super::OPS {
        let r = op_ratio(ranks, alone, op, |l| l.p50_us);
        if r > 0.0 {
            write!(out, " {op} {r:.2}×")?;
        }
    }
    writeln!(out, "\n")
}

/// `f` of `op` in `over` divided by the same in `under` (0 when `under` has
/// no such figure).
fn op_ratio(over: &RunReport, under: &RunReport, op: &str, f: fn(&Latency) -> f64) -> f64 {
    let (a, b) = (
        under.ops.get(op).map_or(0.0, f),
        over.ops.get(op).map_or(0.0, f),
    );
    if a > 0.0 {
        b / a
    } else {
        0.0
    }
}
