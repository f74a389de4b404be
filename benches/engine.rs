//! Criterion benches of the cache engine's hot paths.
//!
//! - `match`: match of a cached 1K/4K/32K-token prompt at P = 1, 16, 64,
//!   beside a `memcmp` of the same tokens as the floor any match pays;
//! - `peek`: a lock-free `TreeReader::peek` of a cached 4K-token prompt at
//!   P = 16, beside the engine's match and a `memcmp` of the same tokens
//!   (one group, so one filter runs all three);
//! - `insert_suffix`: insert of a new 1K/4K/32K-token suffix under a cached
//!   1K-token prefix (pages allocated outside the timed part);
//! - `evict`: eviction of 100k pages (P = 16) spread over 10k leaves;
//! - `evict_skip` / `evict_chains`: the adversarial scan layouts of
//!   DESIGN.md §2 (locked leaves interleaved with evictable ones; deep chains
//!   whose leaf goes before its ancestors). Each prints `evict_scanned` once so
//!   the O(M + K) scan is visible next to the timings.
//! - `evict/locked/{0,1k,10k,50k}`: `evict(1)` (P = 1) with L locked
//!   two-token prompts inserted before 5,000 unlocked ones: eviction never
//!   visits a locked node, so the time per call does not grow with L;
//! - `evict/locked_policy/{policy}/{0,50k}`: the same under each eviction
//!   policy (its heap holds the unlocked leaves only), on one engine size
//!   for both counts;
//! - `host`: the host tier (HiCache) on a 4K-token prompt at P = 16 whose
//!   second half is host-only: `match_host` beside `match_prefix` of the
//!   same prompt all on device (the walk into host-only nodes against the
//!   table's), and a demote then load-back of the half (eviction keeping
//!   the node, then its pages back: SGLang's evict and `load_back` round).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use radixd::engine::{
    Components, Config, Engine, InsertExtra, InsertHints, MambaConfig, Policy, SwaConfig,
};

const PAGE_SIZES: [u32; 3] = [1, 16, 64];
const LENGTHS: [usize; 3] = [1024, 4096, 32768];
const CLIENT: u32 = 0;

/// `n` tokens from a cheap LCG, offset by `seed` so keys differ from the
/// first token on.
fn tokens(seed: u32, n: usize) -> Vec<u32> {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    let mut out = vec![seed];
    out.extend((1..n).map(|_| {
        x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        x >> 8
    }));
    out.truncate(n);
    out
}

fn engine(page_size: u32, capacity: u32) -> Engine {
    Engine::new(Config {
        page_size,
        capacity,
    })
    .unwrap()
}

/// Allocates and inserts `key` (whole pages), unlocked unless `lock`;
/// returns its pages.
fn put(e: &mut Engine, key: &[u32], lock: bool) -> Vec<u32> {
    let pages = e
        .alloc(CLIENT, (key.len() / e.page_size() as usize) as u64)
        .unwrap();
    e.insert(CLIENT, key, &pages, lock).unwrap();
    pages
}

fn bench_match(c: &mut Criterion) {
    let mut g = c.benchmark_group("match");
    for &p in &PAGE_SIZES {
        for &n in &LENGTHS {
            let prompt = tokens(1, n);
            let mut e = engine(p, (n / p as usize) as u32 + 1);
            put(&mut e, &prompt, false);
            // Reused across iterations, as a server would.
            let mut pages = Vec::with_capacity(n / p as usize);
            g.throughput(Throughput::Elements(n as u64));
            g.bench_with_input(
                BenchmarkId::new(format!("P{p}"), n),
                &prompt,
                |b, prompt| {
                    b.iter(|| {
                        let m = e.match_prefix(CLIENT, black_box(prompt), false, &mut pages);
                        debug_assert_eq!(m.len, n);
                        m
                    })
                },
            );
        }
    }
    // Baseline: comparing the prompt with a stored copy, the least any
    // exact-token match can cost.
    for &n in &LENGTHS {
        let (prompt, stored) = (tokens(1, n), tokens(1, n));
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(BenchmarkId::new("memcmp", n), &prompt, |b, prompt| {
            b.iter(|| black_box(prompt.as_slice()) == black_box(stored.as_slice()))
        });
    }
    g.finish();
}

fn bench_peek(c: &mut Criterion) {
    use radixd::engine::{Region, TreeReader};
    let (p, n) = (16u32, 4096usize);
    let mut g = c.benchmark_group("peek");
    g.throughput(Throughput::Elements(n as u64));
    let prompt = tokens(1, n);
    let mut e = engine(p, (n / p as usize) as u32 + 1);
    put(&mut e, &prompt, false);
    let mut pages = Vec::with_capacity(n / p as usize);
    let base = std::ptr::NonNull::new(e.region().as_ptr()).unwrap();
    // SAFETY: the engine's own heap region, alive until `e` drops at the end
    // of this function, after every use of the reader; nothing writes it
    // while the reader runs (the match below runs after the peek bench).
    let reader = unsafe { TreeReader::new(base, e.layout()) };
    g.bench_function(BenchmarkId::new("reader_P16", n), |b| {
        b.iter(|| {
            let len = reader.peek(black_box(&prompt), &mut pages);
            debug_assert_eq!(len, Some(n));
            len
        })
    });
    g.bench_function(BenchmarkId::new("engine_match_P16", n), |b| {
        b.iter(|| e.match_prefix(CLIENT, black_box(&prompt), false, &mut pages))
    });
    // The same prompt on pages in no useful order (every other id, as
    // after long churn): no two consecutive, so no runs.
    let mut scattered = engine(p, 2 * (n / p as usize) as u32 + 1);
    let all = scattered
        .alloc(CLIENT, 2 * (n / p as usize) as u64)
        .unwrap();
    let odd: Vec<u32> = all.iter().copied().filter(|x| x % 2 == 1).collect();
    let even: Vec<u32> = all.iter().copied().filter(|x| x % 2 == 0).collect();
    scattered.free(CLIENT, &even).unwrap();
    scattered.insert(CLIENT, &prompt, &odd, false).unwrap();
    g.bench_function(BenchmarkId::new("engine_match_P16_no_runs", n), |b| {
        b.iter(|| scattered.match_prefix(CLIENT, black_box(&prompt), false, &mut pages))
    });
    let base = std::ptr::NonNull::new(scattered.region().as_ptr()).unwrap();
    // SAFETY: as for `reader` above, over `scattered`, which outlives it.
    let no_runs = unsafe { TreeReader::new(base, scattered.layout()) };
    g.bench_function(BenchmarkId::new("reader_P16_no_runs", n), |b| {
        b.iter(|| no_runs.peek(black_box(&prompt), &mut pages))
    });
    let stored = tokens(1, n);
    g.bench_function(BenchmarkId::new("memcmp", n), |b| {
        b.iter(|| black_box(prompt.as_slice()) == black_box(stored.as_slice()))
    });
    g.finish();
}

fn bench_insert(c: &mut Criterion) {
    // Inserts per engine fill: the pages for them are allocated up front,
    // outside the timed part, then the engine is reset.
    const BATCH: usize = 16;
    const PREFIX: usize = 1024;
    let mut g = c.benchmark_group("insert_suffix");
    for &p in &PAGE_SIZES {
        for &n in &LENGTHS {
            let prefix = tokens(1, PREFIX);
            let keys: Vec<Vec<u32>> = (0..BATCH as u32)
                .map(|j| [prefix.as_slice(), &tokens(100 + j, n)].concat())
                .collect();
            let cap = ((PREFIX + BATCH * n) / p as usize) as u32;
            let mut e = engine(p, cap);
            g.throughput(Throughput::Elements(n as u64));
            g.bench_function(BenchmarkId::new(format!("P{p}"), n), |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    let mut left = iters as usize;
                    while left > 0 {
                        let k = left.min(BATCH);
                        e.reset();
                        let cached = put(&mut e, &prefix, false);
                        // The prefix's own page ids (a no-op), then new ones.
                        let pages: Vec<Vec<u32>> = (0..k)
                            .map(|_| {
                                let new = e.alloc(CLIENT, (n / p as usize) as u64).unwrap();
                                [cached.as_slice(), &new].concat()
                            })
                            .collect();
                        let t = Instant::now();
                        for (key, pages) in keys.iter().zip(&pages) {
                            let ins = e.insert(CLIENT, black_box(key), pages, false).unwrap();
                            debug_assert_eq!(ins.cached, PREFIX);
                            black_box(ins);
                        }
                        total += t.elapsed();
                        left -= k;
                    }
                    total
                })
            });
        }
    }
    g.finish();
}

/// Times `evict(everything)` on engines that `fill` builds, untimed, before
/// each iteration; prints `evict_scanned` of the first run.
fn bench_evict_layout(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    mut e: Engine,
    pages: u64,
    fill: impl Fn(&mut Engine),
) {
    let p = u64::from(e.page_size());
    let mut reported = false;
    g.throughput(Throughput::Elements(pages));
    g.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                e.reset();
                fill(&mut e);
                let t = Instant::now();
                let freed = e.evict(black_box(pages * p));
                total += t.elapsed();
                assert_eq!(freed, pages * p);
                if !reported {
                    let s = e.stats();
                    eprintln!(
                        "{name}: evicted {} pages, evict_scanned = {} list nodes",
                        s.evicted_pages, s.evict_scanned
                    );
                    reported = true;
                }
            }
            total
        })
    });
}

fn bench_evict(c: &mut Criterion) {
    const P: u32 = 16;
    let mut g = c.benchmark_group("evict");
    // Each iteration rebuilds its layout (milliseconds), so few samples.
    g.sample_size(10);

    // 100k pages in 10k leaves of 10 pages under one shared 1-page prefix.
    bench_evict_layout(&mut g, "100k_pages", engine(P, 100_001), 100_000, |e| {
        let root = tokens(1, P as usize);
        let root_page = put(e, &root, true);
        for i in 0..10_000 {
            let key = [root.as_slice(), &tokens(10 + i, 10 * P as usize)].concat();
            // The prefix's own page id, so no duplicate page is allocated.
            let pages = [root_page.as_slice(), &e.alloc(CLIENT, 10).unwrap()].concat();
            e.insert(CLIENT, &key, &pages, false).unwrap();
        }
    });

    // (a) K = 10k locked one-page leaves interleaved in LRU order with
    // M = 10k unlocked ones; evict all M. A restarting scan would visit
    // O(M × K) nodes, a resumable one about M + K.
    const K: u32 = 10_000;
    const M: u32 = 10_000;
    bench_evict_layout(
        &mut g,
        "skip_10k_locked_10k_leaves",
        engine(P, K + M),
        u64::from(M),
        |e| {
            for i in 0..K + M {
                put(e, &tokens(10 + i, P as usize), i % 2 == 0);
            }
        },
    );

    // (b) N = 1000 chains of depth D = 100 one-page nodes, each built by
    // inserting growing prefixes; evict everything. Each chain's leaf must
    // come before its ancestors, so the scan visits each node once.
    const N: u32 = 1000;
    const D: usize = 100;
    bench_evict_layout(
        &mut g,
        "chains_1000x100",
        engine(P, N * D as u32),
        u64::from(N) * D as u64,
        |e| {
            let p = P as usize;
            for c in 0..N {
                let key = tokens(10 + c, D * p);
                let pages = e.alloc(CLIENT, D as u64).unwrap();
                for d in 1..=D {
                    e.insert(CLIENT, &key[..d * p], &pages[..d], false).unwrap();
                }
            }
        },
    );
    g.finish();
}

/// `evict(1)` past L locked nodes older than every victim (issue 20's
/// table): the cost of one small eviction must not depend on L.
fn bench_evict_locked(c: &mut Criterion) {
    const UNLOCKED: u32 = 5_000;
    let mut g = c.benchmark_group("evict/locked");
    for (label, locked) in [("0", 0u32), ("1k", 1_000), ("10k", 10_000), ("50k", 50_000)] {
        let pages = 2 * (locked + UNLOCKED);
        let mut e = engine(1, pages);
        let fill = |e: &mut Engine| {
            e.reset();
            for i in 0..locked + UNLOCKED {
                let key = [i, i];
                let pages = e.alloc(CLIENT, 2).unwrap();
                e.insert(CLIENT, &key, &pages, i < locked).unwrap();
            }
        };
        fill(&mut e);
        let mut left = 2 * u64::from(UNLOCKED);
        let mut reported = false;
        g.bench_function(label, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    if left == 0 {
                        fill(&mut e);
                        left = 2 * u64::from(UNLOCKED);
                    }
                    let before = e.stats().evict_scanned;
                    let t = Instant::now();
                    let freed = e.evict(black_box(1));
                    total += t.elapsed();
                    assert_eq!(freed, 1);
                    left -= 1;
                    if !reported {
                        eprintln!(
                            "evict/locked/{label}: {} nodes visited by one evict(1)",
                            e.stats().evict_scanned - before
                        );
                        reported = true;
                    }
                }
                total
            })
        });
    }
    g.finish();
}

/// `evict(1)` past L locked nodes under each eviction policy (seed 000
/// for every policy), on one engine size: the candidates are the unlocked
/// leaves only, in a heap by the policy's key, so the cost does not grow
/// with L. The prompts carry priorities 0..4 (round robin) so that
/// `priority` orders by more than recency.
fn bench_evict_locked_policies(c: &mut Criterion) {
    const UNLOCKED: u32 = 5_000;
    let mut g = c.benchmark_group("evict/locked_policy");
    let mut policies: Vec<Policy> = Policy::NAMES.iter().map(|n| n.parse().unwrap()).collect();
    // T-LRU as a server runs it (its defaults are plain LRU).
    policies[6] = Policy::Tlru {
        threshold: 3,
        next_prompt_estimate: 1,
    };
    for policy in policies {
        for (label, locked) in [("0", 0u32), ("50k", 50_000)] {
            // One engine size for both: only the locked nodes differ (the
            // `evict/locked` group above sizes the engine to what it holds,
            // so its ratio also carries the larger working set's misses).
            let mut e = engine(1, 2 * (50_000 + UNLOCKED));
            e.set_policy(policy);
            let fill = |e: &mut Engine| {
                e.reset();
                for i in 0..locked + UNLOCKED {
                    let key = [i, i];
                    let pages = e.alloc(CLIENT, 2).unwrap();
                    let hints = InsertHints {
                        priority: i64::from(i % 4),
                        inserted_len: 0,
                    };
                    e.insert_hinted(CLIENT, &key, &pages, i < locked, hints)
                        .unwrap();
                }
            };
            fill(&mut e);
            let mut left = 2 * u64::from(UNLOCKED);
            g.bench_function(format!("{}/{label}", policy.name()), |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        if left == 0 {
                            fill(&mut e);
                            left = 2 * u64::from(UNLOCKED);
                        }
                        let t = Instant::now();
                        let freed = e.evict(black_box(1));
                        total += t.elapsed();
                        assert_eq!(freed, 1);
                        left -= 1;
                    }
                    total
                })
            });
        }
    }
    g.finish();
}

/// A cached 4K prompt, built as eight 512-token turns (a path of eight
/// nodes, SWA leaves capped at one window), matched at P=16: FULL alone
/// against FULL+SWA (W = 512 and 4096 tokens) and FULL+MAMBA (a state at
/// every turn's end).
fn bench_match_hybrid(c: &mut Criterion) {
    let mut g = c.benchmark_group("match/hybrid");
    let (p, n) = (16u32, 4096usize);
    let cap = (n / p as usize) as u32 + 1;
    let swa = |window| Components {
        swa: Some(SwaConfig {
            window,
            capacity: cap,
        }),
        mamba: None,
    };
    let mamba = Components {
        swa: None,
        mamba: Some(MambaConfig { capacity: 16 }),
    };
    let configs = [
        ("full", Components::full()),
        ("swa_W512", swa(512)),
        ("swa_W4096", swa(4096)),
        ("mamba", mamba),
    ];
    let prompt = tokens(1, n);
    for (label, comps) in configs {
        let mut e = Engine::with_components(
            Config {
                page_size: p,
                capacity: cap,
            },
            comps,
        )
        .unwrap();
        for turn in 1..=8 {
            let key = &prompt[..turn * 512];
            let mut ids = Vec::new();
            let cached = e.peek(key, &mut ids);
            let fresh = (key.len() - cached) / p as usize;
            ids.extend(e.alloc(CLIENT, fresh as u64).unwrap());
            let state = comps
                .mamba
                .is_some()
                .then(|| e.alloc_state(CLIENT).unwrap());
            let extra = InsertExtra {
                mamba_state: state,
                swa_evicted: 0,
            };
            e.insert_with(CLIENT, key, &ids, false, extra).unwrap();
        }
        let mut pages = Vec::with_capacity(n / p as usize);
        g.throughput(Throughput::Elements(n as u64));
        g.bench_function(BenchmarkId::new(label, n), |b| {
            b.iter(|| {
                let m = e.match_prefix(CLIENT, black_box(&prompt), false, &mut pages);
                debug_assert_eq!(m.len, n);
                m
            })
        });
    }
    g.finish();
}

fn bench_host(c: &mut Criterion) {
    const P: u32 = 16;
    const N: usize = 4096;
    let mut g = c.benchmark_group("host");
    let prompt = tokens(1, N);
    let pages = (N / P as usize) as u32;
    let cfg = Config {
        page_size: P,
        capacity: pages + 1,
    };
    // The prompt as two nodes, both backed up; the lower one demoted.
    let mut e = Engine::with_host(cfg, pages).unwrap();
    put(&mut e, &prompt[..N / 2], false);
    put(&mut e, &prompt, false);
    let mut device = Vec::new();
    let mut host = Vec::new();
    let lower = e.match_host(&prompt, &mut device, &mut host).best.unwrap();
    let mut next = 0;
    for node in e.backup_chain(lower.to_raw()).unwrap() {
        let n = e.host_node(node.to_raw()).unwrap().device_pages;
        e.backup(node.to_raw(), &(next..next + n).collect::<Vec<_>>())
            .unwrap();
        next += n;
    }
    let mut on_device = engine(P, pages + 1);
    put(&mut on_device, &prompt, false);
    g.throughput(Throughput::Elements(N as u64));
    g.bench_function(BenchmarkId::new("match_prefix_device_P16", N), |b| {
        b.iter(|| on_device.match_prefix(CLIENT, black_box(&prompt), false, &mut device))
    });
    // Demote the lower half: the tree's least recently used leaf.
    e.match_host(&prompt[..N / 2], &mut device, &mut host);
    assert_eq!(e.evict(1), (N / 2) as u64);
    g.bench_function(BenchmarkId::new("match_host_half_host_P16", N), |b| {
        b.iter(|| {
            let m = e.match_host(black_box(&prompt), &mut device, &mut host);
            debug_assert_eq!(m.device_len + m.host_len, N);
            m
        })
    });
    g.bench_function(BenchmarkId::new("demote_load_back_P16", N / 2), |b| {
        b.iter(|| {
            let fresh = e.alloc(CLIENT, (N / 2) as u64 / u64::from(P)).unwrap();
            e.load_back(CLIENT, lower.to_raw(), &fresh).unwrap();
            e.match_host(&prompt[..N / 2], &mut device, &mut host);
            black_box(e.evict(1))
        })
    });
    g.finish();
}

criterion_group!(
    benches,
    bench_host,
    bench_match,
    bench_match_hybrid,
    bench_peek,
    bench_insert,
    bench_evict,
    bench_evict_locked,
    bench_evict_locked_policies
);
criterion_main!(benches);
