//! Round trip of `match` on a cached 1K-token prompt (P=16) through a real
//! daemon (running in a thread of this process) over shared memory, in
//! busy-poll and default mode, against the same engine behind a Unix
//! socket; then 4 clients at once, as threads and as processes.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, SamplingMode, Throughput};
use radixd::bench::{run_once, BenchArgs, Transport, UdsClient, UdsServer};
use radixd::daemon::{serve, ServeConfig};
use radixd::engine::Config;
use radixd::op::Backend;
use radixd::op::Request;
use radixd::Client;
use radixd_ipc::sync::{AtomicU32, Ordering};

const PROMPT: u32 = 1024;
const PAGE: u32 = 16;

fn prompt(seed: u32) -> Vec<u32> {
    (0..PROMPT).map(|i| seed << 16 | i).collect()
}

/// Caches `tokens` through `backend`.
fn warm(backend: &mut dyn Backend, tokens: &[u32]) {
    let n = u64::from(PROMPT / PAGE);
    let Ok(radixd::op::Reply::Pages(pages)) = backend.call(Request::Alloc { n }) else {
        panic!("alloc")
    };
    backend
        .call(Request::Insert {
            tokens: tokens.to_vec(),
            pages,
            lock: false,
        })
        .expect("insert");
}

fn with_daemon(busy_poll: bool, f: impl FnOnce(&str)) {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let name = format!(
        "radixd-ipc-bench-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let config = ServeConfig {
        name: name.clone(),
        page_size: PAGE,
        capacity: 4096,
        max_clients: 8,
        scratch_bytes: 1 << 20,
        busy_poll,
        ..ServeConfig::default()
    };
    let stop = AtomicU32::new(0);
    std::thread::scope(|s| {
        let daemon = s.spawn(|| serve(&config, &stop));
        while Client::connect(&name).is_err() {
            std::thread::sleep(Duration::from_millis(1));
        }
        f(&name);
        stop.store(1, Ordering::Relaxed);
        daemon.join().expect("daemon thread").expect("daemon");
    });
}

/// Runs `f` with a client (holding `tokens` cached) of a fresh daemon in
/// each spin mode, named by its bench label.
fn each_mode(tokens: &[u32], mut f: impl FnMut(&'static str, &mut Client)) {
    for (label, busy) in [("shm_busy_poll", true), ("shm_default", false)] {
        with_daemon(busy, |name| {
            let mut client = Client::connect(name).expect("connect");
            warm(&mut client, tokens);
            f(label, &mut client);
        });
    }
}

fn one_client(c: &mut Criterion) {
    let mut g = c.benchmark_group("round_trip/match_1k_p16");
    g.throughput(Throughput::Elements(1));
    let tokens = prompt(1);
    each_mode(&tokens, |label, client| {
        g.bench_function(label, |b| {
            b.iter(|| black_box(client.match_prefix(&tokens, false).expect("match")))
        });
        // The same path with no payload: what the round trip itself costs.
        g.bench_function(format!("{label}_stats_only"), |b| {
            b.iter(|| black_box(client.stats().expect("stats")))
        });
    });
    let path = PathBuf::from(format!("/tmp/radixd-ipc-bench-{}.sock", std::process::id()));
    let config = Config {
        page_size: PAGE,
        capacity: 4096,
    };
    let _server = UdsServer::start(&path, config).expect("uds server");
    let mut uds = UdsClient::connect(&path, config).expect("uds client");
    warm(&mut uds, &tokens);
    g.bench_function("uds", |b| {
        b.iter(|| {
            black_box(
                uds.call(Request::Match {
                    tokens: tokens.clone(),
                    lock: false,
                })
                .expect("match"),
            )
        })
    });
    g.finish();
}

/// The default mode's case: one request every 100 µs, not back to back.
/// Only the round trips are timed; the client idles (spinning, as a
/// scheduler busy with its GPU work would) between them.
fn paced(c: &mut Criterion) {
    const GAP: Duration = Duration::from_micros(100);
    let mut g = c.benchmark_group("round_trip/match_1k_p16_every_100us");
    g.throughput(Throughput::Elements(1));
    let tokens = prompt(2);
    each_mode(&tokens, |label, client| {
        g.bench_function(label, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let idle = Instant::now();
                    while idle.elapsed() < GAP {
                        std::hint::spin_loop();
                    }
                    let start = Instant::now();
                    black_box(client.match_prefix(&tokens, false).expect("match"));
                    total += start.elapsed();
                }
                total
            })
        });
    });
    g.finish();
}

fn four_clients(c: &mut Criterion) {
    let mut g = c.benchmark_group("round_trip/match_1k_p16_4_threads");
    g.throughput(Throughput::Elements(4));
    with_daemon(false, |name| {
        g.bench_function("shm_default", |b| {
            b.iter_custom(|iters| {
                std::thread::scope(|s| {
                    let start = Instant::now();
                    for t in 0..4 {
                        s.spawn(move || {
                            let mut client = Client::connect(name).expect("connect");
                            let tokens = prompt(10 + t);
                            warm(&mut client, &tokens);
                            for _ in 0..iters {
                                black_box(client.match_prefix(&tokens, false).expect("match"));
                            }
                        });
                    }
                    start
                })
                .elapsed()
            })
        });
    });
    g.finish();
}

/// Four `radixd bench-worker` processes, released together, each running
/// one scheduler step (match+lock, alloc, insert, unlock: 4 requests) per
/// iteration over shm and over the Unix socket. Time is wall time from the
/// release to the last report.
fn four_processes(c: &mut Criterion) {
    let mut g = c.benchmark_group("scheduler_step_4_processes");
    g.throughput(Throughput::Elements(4));
    g.sample_size(10);
    // Linear: the slope over growing runs leaves out the fixed cost of
    // starting the server and releasing the workers.
    g.sampling_mode(SamplingMode::Linear);
    let exe = std::path::Path::new(env!("CARGO_BIN_EXE_radixd"));
    for transport in [Transport::Shm, Transport::Uds] {
        g.bench_function(transport.to_string(), |b| {
            b.iter_custom(|iters| {
                let args = BenchArgs {
                    clients: vec![4],
                    requests: u32::try_from(iters).unwrap_or(u32::MAX),
                    prompt_tokens: PROMPT,
                    page_size: Some(PAGE),
                    capacity: Some(65_536),
                    transport,
                    compare: false,
                    baseline: false,
                    busy_poll: false,
                    full_requests: false,
                    json: true,
                    connect: None,
                    trace: None,
                    block_size: 512,
                    plot: None,
                    kv_events: false,
                    kv_events_compare: false,
                    kv_events_no_subscriber: false,
                    kv_events_latency: false,
                    readers: 0,
                    tp: None,
                    locked: 0,
                    components: "full".into(),
                    swa_window: None,
                    swa_capacity: None,
                    mamba_capacity: None,
                    store: false,
                    store_rounds: 20,
                };
                let report = run_once(&args, transport, 4, exe).expect("bench run");
                Duration::from_secs_f64(report.seconds)
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = one_client, paced, four_clients, four_processes
}
criterion_main!(benches);
