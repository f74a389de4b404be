//! The bench's KV event subscriber: what a router on the daemon's host
//! would receive, counted (`--kv-events`) and timed
//! (`--kv-events-latency`, see [`super::latency`]).

use std::time::{Duration, Instant};

use radixd_ipc::sync::{AtomicU32, Ordering};

use super::latency;
use super::{BenchError, EventFigures};
use crate::Client;

/// The KV event endpoint of the bench daemon `name`.
pub(super) fn events_config(name: &str) -> crate::events::EventsConfig {
    crate::events::EventsConfig::new(format!("ipc://{}", endpoint_path(name).display()))
}

/// The socket file behind [`events_config`]'s endpoint.
pub(super) fn endpoint_path(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("{name}.kv-events"))
}

/// First token of the probes [`await_subscriber`] caches (then one less
/// each): far above a synthetic prompt's tokens of fewer than 250 workers,
/// and below `--locked`'s.
const PROBE: u32 = u32::MAX - (1 << 24);

/// Caches a page after another (each its own, so each is published) until
/// the subscriber of the daemon `name` says it received a batch: ZeroMQ's
/// PUB drops what it sends before a subscription reaches it, and the
/// workers' first events must not be lost. The [`latency::page_key`] of
/// each probe (their events pair with no insert).
pub(super) fn await_subscriber(
    name: &str,
    page: u32,
    seen: &AtomicU32,
) -> Result<Vec<u64>, BenchError> {
    let failed = |e: crate::ClientError| BenchError::Server(format!("probing the subscriber: {e}"));
    let mut client = Client::connect(name).map_err(failed)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut keys = Vec::new();
    for i in 0.. {
        let tokens = vec![PROBE - i; page as usize];
        let pages = client.alloc(1).map_err(failed)?;
        client.insert(&tokens, &pages, false).map_err(failed)?;
        keys.extend(latency::page_key(&tokens, page as usize));
        for _ in 0..10 {
            // Relaxed: a lone flag; nothing else is read through it.
            if seen.load(Ordering::Relaxed) != 0 {
                return Ok(keys);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        if Instant::now() > deadline {
            break;
        }
    }
    Err(BenchError::Server(
        "the KV event subscriber received nothing in 30 s".into(),
    ))
}

/// What the subscriber thread is told, and tells.
#[derive(Clone, Copy)]
pub(super) struct Flags<'a> {
    /// Set when the workers are done.
    pub stop: &'a AtomicU32,
    /// Set by the subscriber when its first batch arrives.
    pub seen: &'a AtomicU32,
}

/// Subscribes to the bench daemon's events until `stop`, then until 0.5 s
/// pass without a batch; with `timed`, notes when each `BlockStored`
/// arrived (`--kv-events-latency`).
pub(super) fn consume(
    config: crate::events::EventsConfig,
    Flags { stop, seen }: Flags<'_>,
    timed: bool,
) -> Result<(EventFigures, Vec<latency::Arrival>), BenchError> {
    #[cfg(feature = "kv-events")]
    {
        use crate::events::batch::KvEvent;
        // Woken as promptly as the publisher (a router on its own host
        // would be): what `--kv-events-latency` measures is the daemon's
        // side and the wire, not this thread waiting for a core.
        crate::events::publisher::event_priority();
        let mut sub = crate::events::subscriber::Subscriber::connect(&config.endpoint, "", None)
            .map_err(|e| BenchError::Server(e.to_string()))?;
        let mut f = EventFigures::default();
        let mut arrivals = Vec::new();
        let mut idle = Instant::now();
        loop {
            match sub
                .recv(Duration::from_millis(50))
                .map_err(|e| BenchError::Server(e.to_string()))?
            {
                Some(r) => {
                    if timed {
                        let received_ns = latency::monotonic_ns();
                        // The batch's stamp on this clock: `ts` is wall
                        // time, so move it by the wall clock's offset now.
                        let ago = latency::realtime_ns() as f64 - r.batch.ts * 1e9;
                        let stamped_ns = received_ns.saturating_sub(ago.max(0.0) as u64);
                        arrivals.extend(r.batch.events.iter().filter_map(|e| match e {
                            KvEvent::BlockStored {
                                token_ids,
                                block_size,
                                ..
                            } => Some(latency::Arrival {
                                key: latency::page_key(token_ids, *block_size as usize)?,
                                received_ns,
                                stamped_ns,
                            }),
                            _ => None,
                        }));
                    }
                    idle = Instant::now();
                    // Relaxed: a lone flag for `await_subscriber`.
                    seen.store(1, Ordering::Relaxed);
                    f.batches += 1;
                    f.events += r.batch.events.len() as u64;
                    f.resyncs += r
                        .batch
                        .events
                        .iter()
                        .filter(|e| matches!(e, KvEvent::AllBlocksCleared))
                        .count() as u64;
                }
                // Relaxed: a lone stop flag.
                None if stop.load(Ordering::Relaxed) != 0
                    && idle.elapsed() > Duration::from_millis(500) =>
                {
                    break
                }
                None => {}
            }
        }
        f.gaps = sub.gaps();
        Ok((f, arrivals))
    }
    #[cfg(not(feature = "kv-events"))]
    {
        let _ = (config, stop, seen, timed);
        Err(BenchError::Server(
            crate::events::EventsError::NotBuilt.to_string(),
        ))
    }
}
