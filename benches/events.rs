//! Criterion benches of what KV events cost, in one process, free of the
//! scheduling noise of `radixd bench --kv-events-compare`:
//!
//! - `record`: insert of a new 1K-token suffix under a cached 1K-token
//!   prefix (P = 16) with the engine's record off, and on with what the
//!   daemon does after the request (take the facts, push them onto a
//!   bounded lock-free queue; the copies go into buffers the publisher
//!   handed back): the request path's whole share;
//! - `publish`: what the publisher thread does per `BlockStored` of 1K
//!   tokens (64 pages): chain-hash every page (xxh3, sha256-cbor) and
//!   encode the event into a batch. Its inverse is the event rate one
//!   publisher core sustains.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use crossbeam_queue::ArrayQueue;
use radixd::engine::{CacheEvent, Config, Engine};
use radixd::events::batch::{BatchWriter, MEDIUM_GPU};
use radixd::events::hash::{Scheme, SchemeName};

const P: usize = 16;
const N: usize = 1024;
const BATCH: usize = 16;

fn tokens(seed: u32, n: usize) -> Vec<u32> {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            x >> 8
        })
        .collect()
}

fn bench_record(c: &mut Criterion) {
    let prefix = tokens(1, N);
    let keys: Vec<Vec<u32>> = (0..BATCH as u32)
        .map(|j| [prefix.as_slice(), &tokens(100 + j, N)].concat())
        .collect();
    let mut g = c.benchmark_group("record");
    g.throughput(Throughput::Elements(N as u64));
    for on in [false, true] {
        let mut e = Engine::new(Config {
            page_size: P as u32,
            capacity: ((N + BATCH * N) / P) as u32,
        })
        .expect("engine");
        e.record_events(on);
        let queue: ArrayQueue<CacheEvent> = ArrayQueue::new(1 << 16);
        let mut taken = Vec::new();
        g.bench_function(if on { "insert_1k_on" } else { "insert_1k_off" }, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut left = iters as usize;
                while left > 0 {
                    let k = left.min(BATCH);
                    e.reset();
                    let cached = e.alloc(0, (N / P) as u64).expect("alloc");
                    e.insert(0, &prefix, &cached, false).expect("insert");
                    let pages: Vec<Vec<u32>> = (0..k)
                        .map(|_| {
                            let new = e.alloc(0, (N / P) as u64).expect("alloc");
                            [cached.as_slice(), &new].concat()
                        })
                        .collect();
                    taken.clear();
                    e.take_events(&mut taken);
                    // The publisher's side, untimed: consume, and hand
                    // the buffers back as it does.
                    while let Some(ev) = queue.pop() {
                        if let CacheEvent::Stored { pages, tokens, .. } = ev {
                            e.recycle_event_buffer(pages);
                            e.recycle_event_buffer(tokens);
                        }
                    }
                    let t = Instant::now();
                    for (key, pages) in keys.iter().zip(&pages) {
                        black_box(e.insert(0, black_box(key), pages, false).expect("insert"));
                        // The daemon's share after a round (see `Feed`).
                        e.take_events(&mut taken);
                        for ev in taken.drain(..) {
                            let _ = queue.push(ev);
                        }
                    }
                    total += t.elapsed();
                    left -= k;
                }
                total
            })
        });
    }
    g.finish();
}

fn bench_publish(c: &mut Criterion) {
    let t = tokens(7, N);
    let mut g = c.benchmark_group("publish");
    g.throughput(Throughput::Elements(1));
    for (name, scheme) in [
        ("stored_1k_xxh3", Scheme::Xxh3),
        (
            "stored_1k_sha256_cbor",
            Scheme::new(SchemeName::Sha256Cbor, "0"),
        ),
    ] {
        let mut buf = Vec::new();
        let mut w = BatchWriter::new();
        let mut ext = Vec::with_capacity(N / P);
        g.bench_function(name, |b| {
            b.iter(|| {
                ext.clear();
                let mut prev = None;
                for page in t.chunks_exact(P) {
                    let full = scheme.block(prev.as_ref(), page, &mut buf);
                    ext.push(scheme.external(&full));
                    prev = Some(full);
                }
                w.stored(&ext, None, &t, P as u32, MEDIUM_GPU, None);
                black_box(w.finish(0.0, 0))
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench_record, bench_publish);
criterion_main!(benches);
