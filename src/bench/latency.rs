//! `--kv-events-latency`: how long after a client is answered an `insert`
//! that cached new pages the bench's subscriber receives the `BlockStored`
//! naming them, over the real wire (ZeroMQ SUB, msgpack), as a router
//! would.
//!
//! Both sides read `CLOCK_MONOTONIC` ([`monotonic_ns`]): the workers are
//! other processes on the same host, so `Instant` (opaque) will not do.
//! An insert and its event are paired by the tokens of the prompt's last
//! whole page ([`page_key`]): the new pages of an insert are one run ending
//! there, and a `BlockStored` carries that run's tokens. A prompt cached
//! twice (evicted in between) is paired in order: its first answer with
//! its first event. The batch's own `ts` (wall clock, stamped by the
//! publisher as it finishes the batch) splits each figure in two: the
//! daemon's side (round, queue, wake-up, hashing and encoding) and the
//! wire's (ZeroMQ's threads, the subscriber's wake-up and decoding).

use std::collections::{HashMap, VecDeque};

use serde::{Deserialize, Serialize};

/// `CLOCK_MONOTONIC` in nanoseconds: one clock for every process of the
/// host.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// `CLOCK_REALTIME` in nanoseconds since the Unix epoch (the clock of a
/// batch's `ts`); only the KV events bench reads it.
#[cfg(feature = "kv-events")]
pub fn realtime_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime(2) writes one `timespec`, a valid local; both
    // clocks exist on every Linux, so it cannot fail (a zero is harmless).
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// The key pairing an insert with its `BlockStored`: XXH3 of the tokens of
/// the last whole page of `tokens` (`page` tokens a page); `None` when
/// there is no whole page.
pub fn page_key(tokens: &[u32], page: usize) -> Option<u64> {
    let whole = tokens.len() / page.max(1) * page.max(1);
    let last = tokens.get(whole.checked_sub(page.max(1))?..whole)?;
    let bytes: Vec<u8> = last.iter().flat_map(|t| t.to_le_bytes()).collect();
    Some(xxhash_rust::xxh3::xxh3_64(&bytes))
}

/// One `BlockStored` as the subscriber received it.
#[derive(Clone, Copy, Debug)]
pub struct Arrival {
    /// [`page_key`] of its tokens.
    pub key: u64,
    /// When `recv` returned it ([`monotonic_ns`]).
    pub received_ns: u64,
    /// When the publisher stamped its batch, on the same clock (the batch's
    /// `ts` moved by the wall clock's offset read at `received_ns`).
    pub stamped_ns: u64,
}

/// p50, p99 and max of a latency, in microseconds.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Spread {
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

impl Spread {
    /// The spread of `ns` (any order; may be negative: see
    /// [`EventLatency::change_to_event`]).
    fn of(mut ns: Vec<i64>) -> Self {
        ns.sort_unstable();
        let at = |q: f64| {
            if ns.is_empty() {
                return 0.0;
            }
            let i = ((ns.len() as f64 * q).ceil() as usize).clamp(1, ns.len()) - 1;
            ns[i] as f64 / 1e3
        };
        Self {
            p50_us: at(0.5),
            p99_us: at(0.99),
            max_us: at(1.0),
        }
    }
}

/// Change-to-event latency of one run.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct EventLatency {
    /// Inserts paired with their event.
    pub matched: u64,
    /// Inserts that cached pages and whose event never came (0 unless
    /// events were lost).
    pub unmatched_inserts: u64,
    /// `BlockStored` events no insert answered (0 unless a resync resent
    /// what was cached).
    pub unmatched_events: u64,
    /// From the client's answer to the subscriber's receipt. A client
    /// descheduled between reading its answer and its clock makes a figure
    /// smaller, even negative.
    pub change_to_event: Spread,
    /// From the client's answer to the batch's stamp: the daemon's round,
    /// the queue, the publisher's wake-up, hashing and encoding.
    pub change_to_batch: Spread,
    /// From the batch's stamp to the subscriber's receipt: the send, libzmq's
    /// I/O threads on both sides, the subscriber's wake-up and decoding.
    pub batch_to_event: Spread,
}

/// Pairs each answered insert (`(key, answered_ns)`, from every worker)
/// with the first unpaired arrival of its key, in arrival order.
pub fn pair(answered: &[[u64; 2]], arrivals: &[Arrival]) -> EventLatency {
    let mut sorted = answered.to_vec();
    sorted.sort_unstable_by_key(|&[_, at]| at);
    let mut waiting: HashMap<u64, VecDeque<u64>> = HashMap::new();
    for [key, at] in sorted {
        waiting.entry(key).or_default().push_back(at);
    }
    let (mut total, mut to_batch, mut to_event) = (Vec::new(), Vec::new(), Vec::new());
    let mut unmatched_events = 0;
    let signed = |a: u64, b: u64| a as i64 - b as i64;
    for a in arrivals {
        match waiting.get_mut(&a.key).and_then(VecDeque::pop_front) {
            Some(at) => {
                total.push(signed(a.received_ns, at));
                to_batch.push(signed(a.stamped_ns, at));
                to_event.push(signed(a.received_ns, a.stamped_ns));
            }
            None => unmatched_events += 1,
        }
    }
    EventLatency {
        matched: total.len() as u64,
        unmatched_inserts: waiting.values().map(|q| q.len() as u64).sum(),
        unmatched_events,
        change_to_event: Spread::of(total),
        change_to_batch: Spread::of(to_batch),
        batch_to_event: Spread::of(to_event),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_the_last_whole_page() {
        let a: Vec<u32> = (0..40).collect();
        // Page 16: the last whole page is 16..32, whatever follows.
        assert_eq!(page_key(&a, 16), page_key(&(0..32).collect::<Vec<_>>(), 16));
        assert_ne!(page_key(&a, 16), page_key(&(1..33).collect::<Vec<_>>(), 16));
        assert_eq!(page_key(&a[..15], 16), None);
    }

    #[test]
    fn repeated_keys_pair_in_order_and_strays_are_counted() {
        let arrive = |key, received_ns, stamped_ns| Arrival {
            key,
            received_ns,
            stamped_ns,
        };
        // Key 7 answered at 100 and 300 (given out of order), key 8 at 200
        // and never delivered; an arrival of key 9 that nothing answered.
        let got = pair(
            &[[7, 300], [8, 200], [7, 100]],
            &[
                arrive(7, 150, 120),
                arrive(9, 160, 160),
                arrive(7, 390, 350),
            ],
        );
        assert_eq!(
            (got.matched, got.unmatched_inserts, got.unmatched_events),
            (2, 1, 1)
        );
        // 50 and 90 ns; 20 and 50 to the stamp; 30 and 40 after it.
        assert_eq!(got.change_to_event.p50_us, 0.05);
        assert_eq!(got.change_to_event.max_us, 0.09);
        assert_eq!(got.change_to_batch.max_us, 0.05);
        assert_eq!(got.batch_to_event.p50_us, 0.03);
    }
}
