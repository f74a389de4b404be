//! radixd's router index against Dynamo's (`dynamo-kv-router` 1.6.1,
//! `RadixTree`) on a Mooncake trace: each request is routed round-robin to
//! one of N workers; per request, both indexes answer `find_matches` for
//! the whole request, then store the blocks that worker lacked (as the
//! worker's KV events would: the blocks after its own matched prefix, under
//! its last matched block). Both answers are folded into a digest that must
//! come out identical.
//!
//! ```text
//! cd bench/dynamo && nice -n 10 cargo run --release -- [TRACE] [--runs 5]
//!   (TRACE: by default ../shared/traces/conversation_trace.jsonl from the repository root)
//! cd bench/dynamo && nice -n 10 cargo run --release -- --concurrency
//! ```
//!
//! Without `--one`, the program runs itself once per run and (index,
//! workers) pair: every run starts cold (a fresh allocator, no pages
//! faulted in yet) for both indexes alike, and its RSS growth is its own
//! index's memory.

use std::process::Command;
use std::time::Instant;

use dynamo_kv_router::protocols::{
    compute_seq_hash_for_block, ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData,
    KvCacheStoreData, KvCacheStoredBlockData, LocalBlockHash, RouterEvent,
};
use dynamo_kv_router::RadixTree;
use radixd::events::hash::xxh3_chain;
use radixd::index::{IndexConfig, KvIndex, OverlapScores, StoredBlock, Worker};

/// The Mooncake conversation trace in `shared/traces/`, beside the
/// repository (`../shared/traces/` from its root, as docs/replay.md has it),
/// found from this crate's directory, wherever the program is run from.
const DEFAULT_TRACE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../../shared/traces/conversation_trace.jsonl"
);

fn load(path: &str) -> Vec<Vec<u64>> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let trace: Vec<Vec<u64>> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("a JSON line");
            v["hash_ids"]
                .as_array()
                .expect("hash_ids")
                .iter()
                .map(|h| h.as_u64().expect("an integer hash id"))
                .collect()
        })
        .collect();
    drop(text);
    // Give the parser's freed memory back to the system, so RSS growth
    // over a run is the index's own (not heap the run merely reuses).
    // SAFETY: glibc's malloc_trim only releases free heap memory.
    unsafe { libc::malloc_trim(0) };
    trace
}

/// FNV-1a over one request's scores, sorted by worker.
fn fold(digest: &mut u64, scores: &mut [(u64, u32)]) {
    scores.sort_unstable();
    for &(w, s) in scores.iter() {
        for x in [w, u64::from(s), u64::MAX] {
            *digest = (*digest ^ x).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    *digest = (*digest ^ 0xabcd).wrapping_mul(0x0000_0100_0000_01b3);
}

/// Dynamo's sequence hashes of a request's local hashes.
fn dynamo_seq(locals: &[LocalBlockHash]) -> Vec<u64> {
    compute_seq_hash_for_block(locals).into_iter().collect()
}

struct Outcome {
    ns_per_block: f64,
    /// RSS (KiB) at the end of the run, the index still alive.
    rss_end: u64,
    digest: u64,
    matched: u64,
}

fn run_dynamo(trace: &[Vec<u64>], workers: u64) -> Outcome {
    let mut tree = RadixTree::new();
    let mut digest = 0xcbf2_9ce4_8422_2325u64;
    let mut matched = 0u64;
    let mut blocks = 0u64;
    let mut scores = Vec::new();
    let start = Instant::now();
    for (i, ids) in trace.iter().enumerate() {
        let worker = i as u64 % workers;
        let locals: Vec<LocalBlockHash> = ids.iter().map(|&h| LocalBlockHash(h)).collect();
        let seq = dynamo_seq(&locals);
        blocks += ids.len() as u64;
        let s = tree.find_matches(locals.clone(), false);
        scores.clear();
        scores.extend(s.scores.iter().map(|(w, &n)| (w.worker_id, n)));
        let own = scores
            .iter()
            .find(|(w, _)| *w == worker)
            .map_or(0, |&(_, n)| n as usize);
        matched += scores.iter().map(|&(_, n)| u64::from(n)).sum::<u64>();
        fold(&mut digest, &mut scores);
        if own < ids.len() {
            let event = KvCacheEvent {
                event_id: i as u64,
                data: KvCacheEventData::Stored(KvCacheStoreData {
                    parent_hash: own
                        .checked_sub(1)
                        .map(|p| ExternalSequenceBlockHash(seq[p])),
                    start_position: None,
                    blocks: (own..ids.len())
                        .map(|b| KvCacheStoredBlockData {
                            block_hash: ExternalSequenceBlockHash(seq[b]),
                            tokens_hash: locals[b],
                            mm_extra_info: None,
                        })
                        .collect(),
                }),
                dp_rank: 0,
            };
            tree.apply_event(RouterEvent::new(worker, event))
                .expect("dynamo store");
        }
    }
    let ns = start.elapsed().as_nanos() as f64;
    Outcome {
        ns_per_block: ns / blocks as f64,
        rss_end: rss_kib(),
        digest,
        matched,
    }
}

fn run_radixd(trace: &[Vec<u64>], workers: u64) -> Outcome {
    let index = KvIndex::new(IndexConfig::xxh3(16)).expect("index");
    let mut digest = 0xcbf2_9ce4_8422_2325u64;
    let mut matched = 0u64;
    let mut blocks = 0u64;
    let mut scores = Vec::new();
    let mut keys = Vec::new();
    let mut store = Vec::new();
    let mut s = OverlapScores::default();
    let start = Instant::now();
    for (i, ids) in trace.iter().enumerate() {
        let worker = i as u64 % workers;
        // The router's work: the request's chained keys (Dynamo's
        // sequence hashes) from its local hashes.
        keys.clear();
        let mut prev: Option<u64> = None;
        for &h in ids {
            let k = prev.map_or(h, |p| xxh3_chain(p, h));
            keys.push(k);
            prev = Some(k);
        }
        blocks += ids.len() as u64;
        index.find_matches_into(&keys, false, &mut s);
        scores.clear();
        scores.extend(s.scores.iter().map(|(w, n)| (w.id, *n)));
        let own = scores
            .iter()
            .find(|(w, _)| *w == worker)
            .map_or(0, |&(_, n)| n as usize);
        matched += scores.iter().map(|&(_, n)| u64::from(n)).sum::<u64>();
        fold(&mut digest, &mut scores);
        if own < ids.len() {
            store.clear();
            store.extend((own..ids.len()).map(|b| StoredBlock {
                hash: keys[b],
                local: ids[b],
            }));
            let parent = own.checked_sub(1).map(|p| keys[p]);
            index
                .store(Worker::new(worker), parent, &store)
                .expect("radixd store");
        }
    }
    let ns = start.elapsed().as_nanos() as f64;
    let st = index.stats();
    eprintln!(
        "radixd index: {} distinct blocks, {} held across workers, table {} KiB",
        st.blocks,
        st.held,
        st.table_bytes / 1024
    );
    Outcome {
        ns_per_block: ns / blocks as f64,
        rss_end: rss_kib(),
        digest,
        matched,
    }
}

/// Resident set size in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// One run in this process: prints `which workers ns/block rss_kib digest
/// matched blocks`.
fn one(which: &str, workers: u64, trace_path: &str) {
    let trace = load(trace_path);
    let blocks: usize = trace.iter().map(Vec::len).sum();
    // Memory: growth over the run (the index is alive while measured).
    let before = rss_kib();
    let o = match which {
        "dynamo" => run_dynamo(&trace, workers),
        _ => run_radixd(&trace, workers),
    };
    let grown = o.rss_end.saturating_sub(before);
    println!(
        "{which} {workers} {:.1} {grown} {:016x} {} {blocks}",
        o.ns_per_block, o.digest, o.matched
    );
}

/// Chained keys of a request's local hashes.
fn chain(ids: &[u64]) -> Vec<u64> {
    let mut prev: Option<u64> = None;
    ids.iter()
        .map(|&h| {
            let k = prev.map_or(h, |p| xxh3_chain(p, h));
            prev = Some(k);
            k
        })
        .collect()
}

/// `find_matches` latency of 4K-token requests (256 blocks of 16 tokens)
/// from `readers` threads, with no writer, then with one thread applying
/// stores and removals as fast as it can: p50 and p99 of each, in µs.
fn concurrency(trace: &[Vec<u64>], readers: usize, secs: f64) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let index = Arc::new(KvIndex::new(IndexConfig::xxh3(16)).expect("index"));
    // 4K-token requests: consecutive trace requests' blocks, 256 at a time.
    let flat: Vec<u64> = trace.iter().flatten().copied().collect();
    let requests: Vec<Vec<u64>> = flat.chunks_exact(256).map(chain).collect();
    let half = requests.len() / 2;
    // The first half cached across 8 workers, the second half for the writer.
    for (i, keys) in requests[..half].iter().enumerate() {
        let ids = &flat[i * 256..(i + 1) * 256];
        let blocks: Vec<StoredBlock> = keys
            .iter()
            .zip(ids)
            .map(|(&k, &l)| StoredBlock { hash: k, local: l })
            .collect();
        index
            .store(Worker::new(i as u64 % 8), None, &blocks)
            .expect("store");
    }
    for writing in [false, true] {
        let stop = Arc::new(AtomicBool::new(false));
        let writer = writing.then(|| {
            let (index, stop) = (Arc::clone(&index), Arc::clone(&stop));
            let (requests, flat) = (requests.clone(), flat.clone());
            std::thread::spawn(move || {
                let mut applied = 0u64;
                let mut i = half;
                while !stop.load(Ordering::Relaxed) {
                    let keys = &requests[i];
                    let ids = &flat[i * 256..(i + 1) * 256];
                    let blocks: Vec<StoredBlock> = keys
                        .iter()
                        .zip(ids)
                        .map(|(&k, &l)| StoredBlock { hash: k, local: l })
                        .collect();
                    let w = Worker::new(8 + i as u64 % 8);
                    index.store(w, None, &blocks).expect("store");
                    let _ = index.remove(w, &keys[128..]);
                    applied += 1;
                    i = if i + 1 == requests.len() { half } else { i + 1 };
                }
                applied
            })
        });
        let handles: Vec<_> = (0..readers)
            .map(|r| {
                let (index, stop, requests) = (
                    Arc::clone(&index),
                    Arc::clone(&stop),
                    requests[..half].to_vec(),
                );
                std::thread::spawn(move || {
                    let mut lat = Vec::new();
                    let mut out = OverlapScores::default();
                    let mut i = r * 7919;
                    while !stop.load(Ordering::Relaxed) {
                        let keys = &requests[i % requests.len()];
                        let t0 = Instant::now();
                        index.find_matches_into(keys, false, &mut out);
                        lat.push(t0.elapsed().as_nanos() as u64);
                        i += 1;
                    }
                    lat
                })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
        let mut lat: Vec<u64> = handles
            .into_iter()
            .flat_map(|h| h.join().expect("reader"))
            .collect();
        let applied = writer.map_or(0, |w| w.join().expect("writer"));
        lat.sort_unstable();
        let q = |f: f64| lat[((lat.len() - 1) as f64 * f) as usize] as f64 / 1000.0;
        println!(
            "{:<26} {:>9} queries  p50 {:>7.2} µs  p99 {:>8.2} µs  ({} store+remove events of 256 blocks)",
            if writing { "while a writer applies" } else { "no writer" },
            lat.len(),
            q(0.5),
            q(0.99),
            applied
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mut trace = DEFAULT_TRACE.to_string();
    let mut runs = 5usize;
    let mut single: Option<(String, u64)> = None;
    let mut i = 1;
    while i < args.len() {
        match args[i].as_str() {
            "--runs" => {
                runs = args[i + 1].parse().expect("--runs N");
                i += 1;
            }
            "--concurrency" => {
                let trace = load(DEFAULT_TRACE);
                println!("find_matches of 4K-token requests (256 blocks), 8 reader threads:");
                concurrency(&trace, 8, 3.0);
                return;
            }
            "--one" => {
                single = Some((args[i + 1].clone(), args[i + 2].parse().expect("workers")));
                i += 2;
            }
            other => trace = other.to_string(),
        }
        i += 1;
    }
    if let Some((which, workers)) = single {
        one(&which, workers, &trace);
        return;
    }
    let me = std::env::current_exe().expect("own path");
    println!(
        "Mooncake trace {trace}: match + store per request, round-robin; each run a fresh process, \
         runs interleaved; median (min-max) of {runs}"
    );
    println!(
        "{:>7}  {:>22}  {:>22}  {:>7}  {:>14}  {:>14}  {:>4}",
        "workers",
        "dynamo ns/block",
        "radixd ns/block",
        "speedup",
        "dynamo RSS KiB",
        "radixd RSS KiB",
        "same"
    );
    for workers in [1u64, 8] {
        // rows[i][run]: the fields of one run's line.
        let mut rows: Vec<Vec<Vec<String>>> = vec![Vec::new(), Vec::new()];
        for _ in 0..runs.max(1) {
            for (i, which) in ["dynamo", "radixd"].iter().enumerate() {
                let out = Command::new(&me)
                    .args([&trace, "--one", which])
                    .arg(workers.to_string())
                    .output()
                    .expect("run a child");
                let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
                assert!(out.status.success(), "{which} {workers}: {line} {out:?}");
                rows[i].push(line.split_whitespace().map(str::to_string).collect());
            }
        }
        let field = |i: usize, f: usize| -> Vec<f64> {
            let mut v: Vec<f64> = rows[i]
                .iter()
                .map(|r| r[f].parse().expect("a number"))
                .collect();
            v.sort_by(f64::total_cmp);
            v
        };
        let med = |v: &[f64]| v[v.len() / 2];
        let (dn, rn) = (field(0, 2), field(1, 2));
        let (dm, rm) = (field(0, 3), field(1, 3));
        let same = rows[0]
            .iter()
            .chain(&rows[1])
            .all(|r| r[4] == rows[0][0][4] && r[5] == rows[0][0][5]);
        println!(
            "{:>7}  {:>22}  {:>22}  {:>6.2}x  {:>14}  {:>14}  {:>4}",
            workers,
            format!("{:.1} ({:.1}-{:.1})", med(&dn), dn[0], dn[dn.len() - 1]),
            format!("{:.1} ({:.1}-{:.1})", med(&rn), rn[0], rn[rn.len() - 1]),
            med(&dn) / med(&rn),
            med(&dm),
            med(&rm),
            if same { "yes" } else { "NO" }
        );
        println!(
            "         digest {} (both), matched blocks {}, {} block accesses",
            rows[0][0][4], rows[0][0][5], rows[0][0][6]
        );
        assert!(same, "the two indexes answered differently");
    }
}
