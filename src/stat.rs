//! `radixd stat`: live figures of a running daemon, read straight from its
//! segment without taking a client slot.

use std::fmt;
use std::time::Duration;

use radixd_ipc::sync::Ordering;
use radixd_ipc::{Offset, Segment, INFO_OFFSET};

use crate::binding::{BindingBoard, BoardError};
use crate::engine::{Recency, TreeReader};
use crate::shared::{
    bucket_floor, read_components, read_info, read_policy, read_recency, Info, LiveStats,
    SharedLayout,
};

/// Why the figures could not be read.
#[derive(Debug)]
pub enum StatError {
    Open(radixd_ipc::OpenError),
    /// The segment is not (yet) a radixd segment this build understands.
    Unreadable(String),
}

impl fmt::Display for StatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Open(e) => write!(f, "cannot open the segment: {e}"),
            Self::Unreadable(m) => write!(f, "cannot read the segment: {m}"),
        }
    }
}

impl std::error::Error for StatError {}

/// One reading of the counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reading {
    pub requests: u64,
    pub rejected: u64,
    pub clients: u64,
    pub reaped: u64,
    pub held_by_readers: u64,
    pub histogram: Vec<u64>,
    /// KV events: `(enabled, batches published, queue overflows)`.
    pub events: (bool, u64, u64),
}

fn read(live: &LiveStats) -> Reading {
    // Relaxed: statistics counters, a best-effort snapshot.
    let get = |x: &radixd_ipc::sync::AtomicU64| x.load(Ordering::Relaxed);
    Reading {
        requests: get(&live.requests),
        rejected: get(&live.rejected),
        clients: get(&live.clients),
        reaped: get(&live.reaped),
        held_by_readers: get(&live.held_by_readers),
        histogram: live.service_ns.iter().map(get).collect(),
        events: (
            get(&live.events_enabled) != 0,
            get(&live.events_batches),
            get(&live.events_overflows),
        ),
    }
}

/// The `q` quantile (0..=1) of a histogram, as the floor of its bucket.
pub fn quantile(histogram: &[u64], q: f64) -> Option<u64> {
    let total: u64 = histogram.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = ((total as f64 * q).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for (bucket, &count) in histogram.iter().enumerate() {
        seen += count;
        if seen >= rank {
            return Some(bucket_floor(bucket));
        }
    }
    None
}

/// What the pool is bound to, as the `pool` line says it.
fn pool_line(segment: &Segment, layout: &SharedLayout) -> String {
    let board = segment.get::<BindingBoard>(Offset::new(layout.binding));
    match board.map(BindingBoard::read) {
        Ok(Ok(Some(b))) => format!(
            "bound to {} ({} client{} bound)",
            b.identity,
            b.holders,
            if b.holders == 1 { "" } else { "s" }
        ),
        Ok(Ok(None)) => "not bound (the first client that binds a KV buffer binds it)".to_owned(),
        Ok(Err(BoardError::Changing)) => "binding changing, try again".to_owned(),
        Ok(Err(BoardError::Garbled)) | Err(_) => "binding unreadable".to_owned(),
    }
}

/// The tokens each namespace holds, read off the shared tree, when any
/// but the default one holds some: `namespaces  default N tokens; #ID N
/// tokens; …` (ids as the daemon gave them, `Client::namespace_id`).
fn namespaces_line(segment: &Segment, layout: &SharedLayout) -> Result<Option<String>, StatError> {
    let base = segment
        .region(layout.engine_at, layout.engine.size() as u64)
        .map_err(|e| StatError::Unreadable(e.to_string()))?;
    // SAFETY: the engine region lies inside the mapping (checked just now),
    // which outlives the reader (dropped at the end of this function); it
    // is page aligned (the layout puts it after a page-aligned stats page),
    // and the reader only copies out of it.
    let reader = unsafe { TreeReader::new(base, layout.engine) };
    let sizes = reader.namespace_tokens();
    if sizes.iter().all(|&(ns, _)| ns == 0) {
        return Ok(None);
    }
    let parts: Vec<String> = sizes
        .iter()
        .map(|&(ns, tokens)| match ns {
            0 => format!("default {tokens} tokens"),
            id => format!("#{id} {tokens} tokens"),
        })
        .collect();
    Ok(Some(format!("namespaces  {}", parts.join("; "))))
}

/// Prints the daemon's figures, with rates over `interval`.
pub fn run(name: &str, interval: Duration) -> Result<(), StatError> {
    let segment = Segment::open_unverified(name).map_err(StatError::Open)?;
    let unreadable = |e: &dyn fmt::Display| StatError::Unreadable(e.to_string());
    let info: &Info = segment
        .get(Offset::new(INFO_OFFSET))
        .map_err(|e| unreadable(&e))?;
    // Acquire: pairs with the Release store of `ready` in `serve`.
    if info.serving.load(Ordering::Acquire) == 0 {
        return Err(unreadable(&"the daemon is still starting"));
    }
    let config = read_info(info).ok_or_else(|| unreadable(&"bad configuration"))?;
    let components = read_components(info).ok_or_else(|| unreadable(&"bad components"))?;
    let recency = read_recency(info).ok_or_else(|| unreadable(&"bad recency"))?;
    let policy = read_policy(info).ok_or_else(|| unreadable(&"bad eviction policy"))?;
    let layout = SharedLayout::new(config).map_err(|e| unreadable(&e))?;
    if layout.ipc.hash != segment.info().layout_hash {
        return Err(unreadable(&"layout mismatch"));
    }
    let live: &LiveStats = segment
        .get(Offset::new(layout.live_stats))
        .map_err(|e| unreadable(&e))?;
    let before = read(live);
    std::thread::sleep(interval);
    let after = read(live);
    let (engine, sessions) = live.engine();
    let window: Vec<u64> = after
        .histogram
        .iter()
        .zip(&before.histogram)
        .map(|(a, b)| a.saturating_sub(*b))
        .collect();
    let (hist, over) = if window.iter().any(|&c| c > 0) {
        (&window, "last interval")
    } else {
        (&after.histogram, "since start")
    };
    let p =
        |q| quantile(hist, q).map_or("-".to_string(), |ns| format!("{:.2} µs", ns as f64 / 1e3));
    let secs = interval.as_secs_f64().max(1e-9);
    let cached = engine.total_tokens / u64::from(config.page_size);
    println!(
        "daemon      pid {} on /dev/shm/{name}",
        segment.info().daemon_pid
    );
    // FULL alone prints as it always did.
    let named = if components.is_full_only() {
        String::new()
    } else {
        format!(", components {}", components.names())
    };
    // The default (exact) prints as it always did, as `serve` announces it.
    let rule = match recency {
        Recency::Exact => "",
        Recency::Sglang => ", sglang recency",
    };
    // LRU, the default, prints as it always did.
    let evicts = if policy.is_lru() {
        String::new()
    } else {
        format!(", eviction policy {policy}")
    };
    println!(
        "config      page size {}, {} pages, {} client slots{named}{rule}{evicts}",
        config.page_size, config.capacity, config.clients
    );
    println!("pool        {}", pool_line(&segment, &layout));
    println!(
        "clients     {} connected, {} reaped after dying",
        after.clients, after.reaped
    );
    let g = live.groups();
    if g.ranks > 0 {
        println!(
            "groups      {} tensor-parallel group(s), {} ranks connected, {} steps kept for ranks behind",
            g.groups, g.ranks, g.kept_steps
        );
    }
    println!(
        "pages       {} free, {} owned by clients, {} cached",
        engine.free_pages, engine.owned_pages, cached
    );
    println!(
        "tokens      {} cached, {} locked, {} evictable; {} nodes, {} sessions",
        engine.total_tokens,
        engine.protected_tokens,
        engine.evictable_tokens,
        engine.nodes,
        sessions
    );
    if let Some(line) = namespaces_line(&segment, &layout)? {
        println!("{line}");
    }
    println!(
        "requests    {} total, {} rejected, {:.0}/s",
        after.requests,
        after.rejected,
        (after.requests - before.requests.min(after.requests)) as f64 / secs
    );
    println!(
        "readers     {} allocs refused while stalled readers held evicted pages",
        after.held_by_readers
    );
    println!(
        "service     p50 {}, p90 {}, p99 {}, p99.9 {} ({over})",
        p(0.5),
        p(0.9),
        p(0.99),
        p(0.999)
    );
    println!(
        "evictions   {} pages, {} nodes visited",
        engine.evicted_pages, engine.evict_scanned
    );
    let c = live.components();
    if let Some(s) = components.swa {
        println!(
            "swa         window {} tokens; {} of {} pages free; {} tokens evictable, {} locked; {} nodes visited by evictions",
            s.window,
            c.swa_free_pages,
            s.capacity,
            c.swa_evictable_tokens,
            c.swa_protected_tokens,
            c.evict_scanned_swa
        );
    }
    if let Some(m) = components.mamba {
        println!(
            "mamba       {} of {} states free; {} evictable, {} locked; {} nodes visited by evictions",
            c.mamba_free_states,
            m.capacity,
            c.mamba_evictable_states,
            c.mamba_protected_states,
            c.evict_scanned_mamba
        );
    }
    // Relaxed: ordered by the Acquire load of `serving` above.
    let store_bytes = info.store_bytes.load(Ordering::Relaxed);
    if store_bytes > 0 {
        match crate::store::StoreMap::open(name) {
            Ok(map) => {
                let st = crate::store::StoreReader::new(map.view(), 0).stats();
                for line in store_lines(&st) {
                    println!("{line}");
                }
            }
            Err(e) => println!("store       unreadable: {e}"),
        }
    }
    if let (true, batches, overflows) = after.events {
        println!(
            "kv events   {batches} batches published, {overflows} queue overflows (each resynced)"
        );
    }
    Ok(())
}

/// The `store` lines of `radixd stat`.
pub fn store_lines(st: &crate::store::StoreStats) -> [String; 2] {
    [
        format!(
            "store       {} values, {} of {} bytes, {} namespaces",
            st.values, st.bytes, st.capacity_bytes, st.namespaces
        ),
        format!(
            "store gets  {} hits, {} misses; {} evicted, {} failed reserves",
            st.hits, st.misses, st.evicted, st.failed_reserves
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::{bucket_of, HISTOGRAM_BUCKETS};

    #[test]
    fn quantiles_pick_the_right_bucket() {
        let mut h = vec![0; HISTOGRAM_BUCKETS];
        h[bucket_of(100)] = 90;
        h[bucket_of(10_000)] = 10;
        assert_eq!(quantile(&h, 0.5), Some(bucket_floor(bucket_of(100))));
        assert_eq!(quantile(&h, 0.95), Some(bucket_floor(bucket_of(10_000))));
        assert_eq!(quantile(&vec![0; HISTOGRAM_BUCKETS], 0.5), None);
    }
}
