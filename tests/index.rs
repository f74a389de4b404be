//! The router index (`radixd::index`, `radixd index`): fed the events
//! real radixd engines record, it holds exactly what each engine caches
//! (scores equal every engine's own prefix match, tree sizes its cached
//! pages), whatever hash scheme each worker publishes with; bad input from
//! one worker never changes another's answers; readers querying while a
//! writer applies never see a wrong score for a worker whose blocks are
//! stable; and end to end, `radixd index serve` following `radixd serve
//! --kv-events` daemons answers `radixd index query` as the daemons' own
//! caches say.

#![cfg(feature = "index")]

mod common;

use common::Rng;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

use radixd::engine::{CacheEvent, Config, Engine};
use radixd::events::batch::{decode_batch, BatchLayout, KvEvent};
use radixd::events::encode::EventEncoder;
use radixd::events::hash::{Scheme, SchemeName};
use radixd::index::{ApplyError, IndexConfig, KvIndex, OverlapScores, Worker};

const P: usize = 4;

/// A prompt: one of 3 system prompts, one of 4 few-shot blocks, a user
/// turn: prefixes shared unevenly across prompts (and so across workers).
fn prompt(rng: &mut Rng) -> Vec<u32> {
    let sys = rng.below(3) as u32;
    let mut t: Vec<u32> = (0..(8 + 4 * sys)).map(|i| 1000 * (sys + 1) + i).collect();
    let shot = rng.below(4) as u32;
    t.extend((0..(4 + shot * 3)).map(|i| 100 + 10 * shot + i));
    t.extend((0..rng.below(20)).map(|_| rng.below(5) as u32));
    t
}

/// One radixd engine recording events, and the encoder that turns them
/// into vLLM batches as its publisher would.
struct Node {
    engine: Engine,
    encoder: EventEncoder,
    recorded: Vec<CacheEvent>,
}

impl Node {
    fn new(scheme: Scheme, layout: BatchLayout) -> Self {
        let mut engine = Engine::new(Config {
            page_size: P as u32,
            capacity: 40,
        })
        .expect("engine");
        engine.record_events(true);
        Self {
            engine,
            encoder: EventEncoder::new(scheme, P as u32, "GPU", layout),
            recorded: Vec::new(),
        }
    }

    /// One random step of a scheduler's life.
    fn step(&mut self, rng: &mut Rng) {
        match rng.below(10) {
            0..=6 => {
                let t = prompt(rng);
                let n = (t.len() / P) as u64;
                match self.engine.alloc(0, n) {
                    Ok(pages) => {
                        // Pages of an already cached prefix are duplicates
                        // and go back to the pool.
                        self.engine.insert(0, &t, &pages, false).expect("insert");
                    }
                    Err(_) => {
                        self.engine.evict(rng.below(40) + 4);
                    }
                }
            }
            7 | 8 => {
                self.engine.evict(rng.below(24));
            }
            _ => {
                if rng.below(8) == 0 {
                    self.engine.reset();
                }
            }
        }
    }

    /// The events recorded since the last call, as one encoded batch.
    fn batch(&mut self, rank: u32) -> Option<Vec<u8>> {
        self.engine.take_events(&mut self.recorded);
        for e in self.recorded.drain(..) {
            self.encoder.event(&e);
        }
        (!self.encoder.is_empty()).then(|| self.encoder.finish(0.0, rank))
    }

    /// Cached pages of `tokens`' longest cached prefix.
    fn peek_blocks(&self, tokens: &[u32]) -> u32 {
        let mut pages = Vec::new();
        (self.engine.peek(tokens, &mut pages) / P) as u32
    }

    fn cached_pages(&self) -> u64 {
        self.engine.stats().total_tokens / P as u64
    }
}

/// Every engine's view of `prompts` must be the index's.
fn agree(index: &KvIndex, nodes: &[Node], prompts: &[Vec<u32>]) {
    for t in prompts {
        let s = index.find_matches_for_tokens(t, false);
        for (i, n) in nodes.iter().enumerate() {
            let want = n.peek_blocks(t);
            let got = s.score(Worker::new(i as u64));
            assert_eq!(
                got,
                (want > 0).then_some(want),
                "worker {i}, prompt {t:?}: index {got:?}, engine {want}"
            );
        }
    }
    let sizes = index.workers();
    for (i, n) in nodes.iter().enumerate() {
        let got = sizes
            .iter()
            .find(|(w, _)| w.id == i as u64)
            .map_or(0, |&(_, s)| s);
        assert_eq!(got, n.cached_pages(), "tree size of worker {i}");
    }
}

fn bank(seed: u64, n: usize) -> Vec<Vec<u32>> {
    let mut rng = Rng(seed);
    (0..n).map(|_| prompt(&mut rng)).collect()
}

/// `workers` engines, each publishing with its own scheme, into one index
/// keyed by `index_scheme`.
fn reconstruct(index_scheme: Scheme, workers: &[(Scheme, BatchLayout)], steps: usize) {
    let index = KvIndex::new(IndexConfig {
        block_size: P as u32,
        scheme: index_scheme,
    })
    .expect("index");
    let mut nodes: Vec<Node> = workers
        .iter()
        .map(|(s, l)| Node::new(s.clone(), *l))
        .collect();
    let prompts = bank(99, 60);
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for step in 0..steps {
        for (i, n) in nodes.iter_mut().enumerate() {
            for _ in 0..rng.below(4) {
                n.step(&mut rng);
            }
            if let Some(payload) = n.batch(0) {
                let batch = decode_batch(&payload).expect("a batch the index can read");
                let report = index.apply(i as u64, &batch);
                assert!(report.errors.is_empty(), "step {step}: {:?}", report.errors);
            }
        }
        if step % 25 == 24 {
            agree(&index, &nodes, &prompts);
        }
    }
    agree(&index, &nodes, &prompts);
    let evicted: u64 = nodes.iter().map(|n| n.engine.stats().evicted_pages).sum();
    assert!(evicted > 0, "the workload evicted");
    assert!(index.stats().blocks > 0, "something stayed cached");
}

fn sha(seed: &str) -> Scheme {
    Scheme::new(SchemeName::Sha256Cbor, seed)
}

#[test]
fn the_index_holds_what_each_engine_caches_xxh3() {
    let w = (Scheme::Xxh3, BatchLayout::Array);
    reconstruct(Scheme::Xxh3, &[w.clone(), w.clone(), w.clone(), w], 300);
}

#[test]
fn the_index_holds_what_each_engine_caches_sha256_cbor() {
    let w = (sha("0"), BatchLayout::Map);
    reconstruct(sha("0"), &[w.clone(), w.clone(), w], 200);
}

#[test]
fn workers_publishing_other_hashes_still_match_by_tokens() {
    // The index keys by tokens: workers with another scheme or another
    // PYTHONHASHSEED name the same blocks differently and still count.
    reconstruct(
        Scheme::Xxh3,
        &[
            (Scheme::Xxh3, BatchLayout::Array),
            (sha("7"), BatchLayout::Array),
            (sha("12345"), BatchLayout::Map),
        ],
        200,
    );
}

#[test]
fn data_parallel_ranks_are_workers_of_their_own() {
    let index = KvIndex::new(IndexConfig::xxh3(P as u32)).expect("index");
    let mut a = Node::new(Scheme::Xxh3, BatchLayout::Array);
    let mut b = Node::new(Scheme::Xxh3, BatchLayout::Array);
    let mut rng = Rng(5);
    for _ in 0..50 {
        a.step(&mut rng);
        b.step(&mut rng);
        for (n, rank) in [(&mut a, 0u32), (&mut b, 3)] {
            if let Some(p) = n.batch(rank) {
                index.apply(7, &decode_batch(&p).expect("batch"));
            }
        }
    }
    for t in bank(3, 40) {
        let s = index.find_matches_for_tokens(&t, false);
        for (n, rank) in [(&a, 0u32), (&b, 3)] {
            let want = n.peek_blocks(&t);
            assert_eq!(
                s.score(Worker {
                    id: 7,
                    dp_rank: rank
                }),
                (want > 0).then_some(want)
            );
        }
    }
    index.remove_worker(7);
    assert!(index.workers().is_empty(), "remove_worker takes every rank");
}

/// Another worker's answers, to compare before and after bad input.
fn answers(index: &KvIndex, prompts: &[Vec<u32>], worker: Worker) -> Vec<Option<u32>> {
    prompts
        .iter()
        .map(|t| index.find_matches_for_tokens(t, false).score(worker))
        .collect()
}

#[test]
fn bad_input_from_one_worker_never_changes_another() {
    let index = KvIndex::new(IndexConfig::xxh3(P as u32)).expect("index");
    let mut good = Node::new(Scheme::Xxh3, BatchLayout::Array);
    let mut rng = Rng(77);
    for _ in 0..80 {
        good.step(&mut rng);
    }
    let payload = good.batch(0).expect("events");
    index.apply(0, &decode_batch(&payload).expect("batch"));
    let prompts = bank(4, 50);
    let before = answers(&index, &prompts, Worker::new(0));
    assert!(before.iter().any(Option::is_some));
    let bad = Worker::new(1);

    // Events that make no sense for worker 1 (which shares every block
    // hash of worker 0's events): refused, counted, nothing else.
    let mut refused = 0;
    let batch = decode_batch(&payload).expect("batch");
    for e in &batch.events {
        if let KvEvent::BlockStored {
            block_hashes,
            parent_block_hash: Some(p),
            token_ids,
            ..
        } = e
        {
            let wrong = KvEvent::BlockStored {
                block_hashes: block_hashes.clone(),
                parent_block_hash: Some(*p),
                token_ids: token_ids.clone(),
                block_size: P as u32,
                lora_id: None,
                medium: None,
            };
            assert_eq!(
                index.apply_event(bad, &wrong),
                Err(ApplyError::ParentNotFound)
            );
            refused += 1;
        }
        if let KvEvent::BlockRemoved { block_hashes, .. } = e {
            assert_eq!(
                index.remove(bad, block_hashes),
                Err(ApplyError::BlockNotFound)
            );
        }
    }
    assert!(refused > 0, "the workload had stores under a parent");
    let short = KvEvent::BlockStored {
        block_hashes: vec![1, 2],
        parent_block_hash: None,
        token_ids: vec![1; P + 1],
        block_size: P as u32,
        lora_id: None,
        medium: None,
    };
    assert_eq!(index.apply_event(bad, &short), Err(ApplyError::TokensShort));
    assert_eq!(answers(&index, &prompts, Worker::new(0)), before);
    assert!(
        answers(&index, &prompts, bad).iter().all(Option::is_none),
        "refused events left worker 1 holding nothing"
    );

    // Mutated payloads: whatever still decodes is applied to worker 1;
    // worker 0 answers as before.
    let mut decoded = 0;
    for i in 0..3000 {
        let mut p = payload.clone();
        let at = rng.below(p.len() as u64) as usize;
        match i % 3 {
            0 => p[at] ^= 1 << rng.below(8),
            1 => p.truncate(at),
            _ => p[at] = rng.below(256) as u8,
        }
        if let Ok(b) = decode_batch(&p) {
            decoded += 1;
            index.apply(1, &b);
        }
    }
    assert!(decoded > 0, "some mutations still decode");
    assert_eq!(answers(&index, &prompts, Worker::new(0)), before);
    // Worker 1 only ever holds blocks whose tokens it was told of: its
    // scores never exceed the prompt's blocks, and clearing it empties it.
    index.clear(bad).expect("clear");
    assert!(answers(&index, &prompts, bad).iter().all(Option::is_none));
    assert_eq!(answers(&index, &prompts, Worker::new(0)), before);
    let s = index.stats();
    assert!(s.errors.iter().sum::<u64>() > 0, "refusals are counted");
}

#[test]
fn readers_never_block_nor_see_a_wrong_score_while_a_writer_applies() {
    let index = Arc::new(KvIndex::new(IndexConfig::xxh3(P as u32)).expect("index"));
    // Worker 0 holds a fixed set of prompts for the whole test.
    let stable = bank(11, 8);
    let mut n0 = Node::new(Scheme::Xxh3, BatchLayout::Array);
    for t in &stable {
        let pages = n0.engine.alloc(0, (t.len() / P) as u64).expect("alloc");
        n0.engine.insert(0, t, &pages, false).expect("insert");
    }
    index.apply(
        0,
        &decode_batch(&n0.batch(0).expect("events")).expect("batch"),
    );
    let expected: Vec<u32> = stable.iter().map(|t| n0.peek_blocks(t)).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let queries = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..3)
        .map(|r| {
            let (index, stop, queries) =
                (Arc::clone(&index), Arc::clone(&stop), Arc::clone(&queries));
            let (stable, expected) = (stable.clone(), expected.clone());
            thread::spawn(move || {
                let mut i = r;
                while !stop.load(Ordering::Relaxed) {
                    let t = &stable[i % stable.len()];
                    let s: OverlapScores = index.find_matches_for_tokens(t, false);
                    assert_eq!(
                        s.score(Worker::new(0)),
                        Some(expected[i % stable.len()]),
                        "the stable worker's score never wavers"
                    );
                    for (w, score) in &s.scores {
                        assert!(*score as usize <= t.len() / P, "{w:?} scored {score}");
                    }
                    i += 1;
                    queries.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    // The writer: three more engines' workloads, and workers leaving and
    // joining (slot reuse) all the while.
    let mut nodes: Vec<Node> = (0..3)
        .map(|_| Node::new(Scheme::Xxh3, BatchLayout::Array))
        .collect();
    let mut rng = Rng(31);
    for round in 0..400u64 {
        for (i, n) in nodes.iter_mut().enumerate() {
            n.step(&mut rng);
            if let Some(p) = n.batch(0) {
                index.apply(1 + i as u64, &decode_batch(&p).expect("batch"));
            }
        }
        if round % 50 == 49 {
            // A worker that caches the stable prompts too, then leaves.
            let id = 100 + round;
            let mut guest = Node::new(Scheme::Xxh3, BatchLayout::Array);
            for t in &stable {
                let pages = guest.engine.alloc(0, (t.len() / P) as u64).expect("alloc");
                guest.engine.insert(0, t, &pages, false).expect("insert");
            }
            index.apply(
                id,
                &decode_batch(&guest.batch(0).expect("events")).expect("batch"),
            );
            index.remove_worker(id);
        }
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().expect("a reader panicked");
    }
    assert!(queries.load(Ordering::Relaxed) > 0);
    let mut all = vec![n0];
    all.extend(nodes);
    agree(&index, &all, &bank(12, 40));
}

#[cfg(feature = "kv-events")]
mod end_to_end {
    use std::collections::HashMap;
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    use super::{bank, Rng, P};
    use crate::common::{radixd, wait_for, Daemon, PUBLISH_DEADLINE};
    use radixd::Client;

    fn endpoints(tag: &str) -> (String, String) {
        let base = format!("/tmp/radixd-ix-{}-{tag}", std::process::id());
        (format!("ipc://{base}.pub"), format!("ipc://{base}.replay"))
    }

    /// Removes the socket files of `ipc://` endpoints when dropped: they
    /// outlive the sockets bound to them.
    struct IpcFiles(Vec<String>);

    impl Drop for IpcFiles {
        fn drop(&mut self) {
            for e in &self.0 {
                if let Some(path) = e.strip_prefix("ipc://") {
                    let _ = std::fs::remove_file(path);
                }
            }
        }
    }

    struct Killed(Child);

    impl Drop for Killed {
        fn drop(&mut self) {
            // SAFETY: kill(2) on our own child's pid; no memory involved.
            unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
            let _ = self.0.wait();
        }
    }

    fn cache(c: &mut Client, tokens: &[u32]) {
        let m = c.match_prefix(tokens, true).expect("match");
        let need = (tokens.len() / P - m.pages.len()) as u64;
        if let Ok(new) = c.alloc(need) {
            let mut pages = m.pages.clone();
            pages.extend(new);
            if c.insert(tokens, &pages, false).is_err() {
                let _ = c.free(&pages);
            }
        }
        if let Some(h) = m.handle {
            let _ = c.unlock(h);
        }
    }

    fn query(endpoint: &str, tokens: &[u32]) -> serde_json::Value {
        let out = radixd()
            .args(["index", "query", "--connect", endpoint, "--tokens"])
            .arg(serde_json::to_string(tokens).expect("json"))
            .output()
            .expect("radixd index query");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(text.lines().count(), 1, "one JSON line: {text}");
        let v: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(v["ok"], true, "{text}");
        assert!(out.status.success());
        v
    }

    /// What the daemons' own caches say for `tokens`.
    fn expected(clients: &mut [(String, Client)], tokens: &[u32]) -> serde_json::Value {
        let mut scores = serde_json::Map::new();
        let mut sizes = serde_json::Map::new();
        for (name, c) in clients.iter_mut() {
            let (len, _) = c.peek(tokens).expect("peek");
            if len >= P {
                scores.insert(name.clone(), (len / P).into());
            }
            let (stats, _) = c.stats().expect("stats");
            sizes.insert(name.clone(), (stats.total_tokens / P as u64).into());
        }
        serde_json::json!({"ok": true, "scores": scores, "tree_sizes": sizes})
    }

    #[test]
    fn index_serve_follows_daemons_and_answers_queries() {
        let mut daemons = Vec::new();
        let mut subs = Vec::new();
        for name in ["a", "b"] {
            let (ep, rep) = endpoints(name);
            let d = Daemon::start(&[
                "--page-size",
                "4",
                "--capacity",
                "64",
                "--kv-events",
                &ep,
                "--kv-events-replay",
                &rep,
            ]);
            subs.push(format!("{name}={ep}@{rep}"));
            daemons.push((name.to_string(), d));
        }
        // Worker `c` is a publisher the test owns: garbage, then silence.
        let (c_ep, c_rep) = endpoints("c");
        let ctx = zmq::Context::new();
        let garbage = ctx.socket(zmq::PUB).expect("PUB");
        garbage.bind(&c_ep).expect("bind");
        // A replay socket that never answers.
        let mute = ctx.socket(zmq::ROUTER).expect("ROUTER");
        mute.bind(&c_rep).expect("bind");
        subs.push(format!("c={c_ep}@{c_rep}"));

        // Some history before the index starts: it replays from 0.
        let mut clients: Vec<(String, Client)> = daemons
            .iter()
            .map(|(n, d)| (n.clone(), Client::connect(&d.name).expect("connect")))
            .collect();
        let mut rng = Rng(4242);
        let prompts = bank(21, 30);
        for _ in 0..20 {
            let t = &prompts[rng.below(prompts.len() as u64) as usize];
            cache(&mut clients[0].1, t);
        }

        let listen = format!("ipc:///tmp/radixd-ix-{}-q", std::process::id());
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_radixd"));
        cmd.args(["index", "serve", "--listen", &listen, "--block-size", "4"])
            .args(["--replay-timeout-ms", "300"])
            .stdin(Stdio::null())
            .stderr(Stdio::null());
        for s in &subs {
            cmd.args(["--subscribe", s]);
        }
        let _index = Killed(cmd.spawn().expect("radixd index serve"));
        let _files = IpcFiles(vec![listen.clone(), c_ep.clone(), c_rep.clone()]);

        // Garbage from `c`: wrong frame counts, bad sequence frames, bad
        // msgpack, a sequence jump (a replay that never comes).
        let send_garbage = || {
            let _ = garbage.send_multipart([&b""[..], &[1, 2, 3], b"junk"], 0);
            let _ = garbage.send(&b"one frame"[..], 0);
            let _ = garbage.send_multipart([&b""[..], &5u64.to_be_bytes(), &[0x93, 0xc1, 0x00]], 0);
            let _ = garbage.send_multipart([&b""[..], &900u64.to_be_bytes(), &[0x90]], 0);
        };
        let deadline = Instant::now() + Duration::from_millis(600);
        while Instant::now() < deadline {
            send_garbage();
            std::thread::sleep(Duration::from_millis(50));
        }

        for round in 0..80 {
            let which = rng.below(2) as usize;
            let t = prompts[rng.below(prompts.len() as u64) as usize].clone();
            cache(&mut clients[which].1, &t);
            if round % 10 == 0 {
                let _ = clients[which].1.evict(rng.below(30));
            }
        }
        // The index converges on what the daemons hold.
        let probe = bank(22, 20);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mismatch = probe.iter().chain(&prompts).find_map(|t| {
                let mut want = expected(&mut clients, t);
                want["tree_sizes"]["c"] = 0.into();
                let got = query(&listen, t);
                (got != want).then(|| format!("{t:?}: got {got}, want {want}"))
            });
            match mismatch {
                None => break,
                Some(m) if Instant::now() > deadline => panic!("no convergence: {m}"),
                Some(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
        // Errors are JSON too, with a non-zero exit.
        let out = radixd()
            .args(["index", "query", "--connect", &listen, "--tokens", "[1,-2]"])
            .output()
            .expect("query");
        assert!(!out.status.success());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("an error as JSON");
        assert_eq!(v["ok"], false);
        assert_eq!(v["error"], "bad_argument");
        // Garbage on the query socket: an error answer each, and the
        // socket goes on answering.
        let req = ctx.socket(zmq::REQ).expect("REQ");
        req.connect(&listen).expect("connect");
        let ask = |frames: &[&[u8]]| -> radixd::events::msgpack::Value {
            req.send_multipart(frames, 0).expect("send");
            assert!(req.poll(zmq::POLLIN, 5000).expect("poll") > 0, "an answer");
            radixd::events::msgpack::decode(&req.recv_bytes(0).expect("recv")).expect("msgpack")
        };
        let error_kind = |v: &radixd::events::msgpack::Value| match v {
            radixd::events::msgpack::Value::Map(p) => {
                radixd::index::protocol::get(p, "error").cloned()
            }
            _ => None,
        };
        let bad = radixd::events::msgpack::Value::Str("bad_request".into());
        assert_eq!(error_kind(&ask(&[b"\xc1"])), Some(bad.clone()));
        assert_eq!(error_kind(&ask(&[b"a", b"b"])), Some(bad.clone()));
        let good = radixd::index::protocol::Request::Stats.encode();
        assert_eq!(error_kind(&ask(&[&good])), None);
        // The figures name every feed; `c` counted its garbage. Its
        // subscriber counts on its own thread, and a PUB socket drops what
        // it sends before the subscriber has connected: the garbage goes
        // again until the figures show it.
        wait_for(PUBLISH_DEADLINE, || {
            send_garbage();
            let out = radixd()
                .args(["index", "stat", "--connect", &listen, "--interval", "0.1"])
                .output()
                .expect("stat");
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            assert!(out.status.success(), "{text}");
            let feeds: HashMap<&str, &str> = text
                .lines()
                .filter_map(|l| l.strip_prefix("feed "))
                .filter_map(|l| l.split_once(' '))
                .collect();
            assert_eq!(feeds.len(), 3, "{text}");
            assert!(text.contains("workers      3"), "{text}");
            let c = feeds["c"];
            match (c.contains(" 0 malformed"), c.contains(" 0 gaps")) {
                (false, false) => Ok(()),
                _ => Err(format!("the garbage and the jump not yet counted: {text}")),
            }
        });
    }
}
