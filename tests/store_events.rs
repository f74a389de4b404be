//! KV events of the node-wide store (`radixd serve --store SIZE
//! --kv-events`): every commit is a `BlockStored` and every eviction or
//! clear a `BlockRemoved`, of medium `CPU`, one block named by its key
//! (`radixd::events::store::store_block`), the parent from the store's
//! parent link, no tokens. A subscriber replaying from 0 rebuilds exactly
//! what the store holds, also across a `reset` (the store is announced
//! again after `AllBlocksCleared`) and a new daemon adopting the store;
//! vLLM's msgspec structs decode every message; and `radixd::index` fed
//! from the stream scores the node's store hits apart from its device's.
//!
//! The Python part uses the interpreter in `RADIXD_PYTHON` (scripts/test
//! sets it up); without it it is skipped with a notice, except under
//! `CI=true`, where it fails.

#![cfg(feature = "kv-events")]

mod common;

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::Daemon;
use radixd::events::batch::{Batch, KvEvent};
use radixd::events::hash::Scheme;
use radixd::events::msgpack::{self, Value};
use radixd::events::publisher::END_SEQ;
use radixd::events::store::{store_block, MEDIUM_STORE};
use radixd::events::subscriber::Subscriber;
use radixd::index::{IndexConfig, KvIndex, Worker};
use radixd::op::Request;
use radixd::store::{StoreItem, StoreNs};
use radixd::Client;

/// Tokens per page (the daemon's `--page-size`, every event's block size).
const P: usize = 4;
/// Bytes of a store value: 8 per 128 KiB extent of a 1 MiB store, so 64
/// values fit and more evict.
const VALUE: u64 = 16 << 10;

/// Removes a daemon's store file when the test ends.
struct StoreFileGuard(std::path::PathBuf);

impl Drop for StoreFileGuard {
    fn drop(&mut self) {
        drop(std::fs::remove_file(&self.0));
    }
}

/// Removes the socket files of ipc:// endpoints when the test ends.
struct SocketFiles(Vec<String>);

impl Drop for SocketFiles {
    fn drop(&mut self) {
        for ep in &self.0 {
            if let Some(path) = ep.strip_prefix("ipc://") {
                drop(std::fs::remove_file(path));
            }
        }
    }
}

fn sockets(endpoints: &[&str]) -> SocketFiles {
    SocketFiles(endpoints.iter().map(|e| e.to_string()).collect())
}

/// Fresh ipc:// endpoints (events, replay) under /tmp.
fn endpoints() -> (String, String) {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let base = format!("/tmp/radixd-store-ev-{}-{n}", std::process::id());
    (format!("ipc://{base}.pub"), format!("ipc://{base}.replay"))
}

/// A daemon (on segment `name` when given) with a 1 MiB store publishing
/// events (`extra` flags added), and its endpoints.
fn start_with(name: Option<&str>, extra: &[&str]) -> (Daemon, String, String) {
    let (ep, rep) = endpoints();
    let mut args = vec![
        "--page-size",
        "4",
        "--capacity",
        "96",
        "--store",
        "1MiB",
        "--kv-events",
        &ep,
        "--kv-events-replay",
        &rep,
        "--kv-events-buffer",
        "1000000",
        "--allow-reset",
        "--kv-events-hash-seed",
        "0",
    ];
    args.extend_from_slice(extra);
    let d = match name {
        Some(n) => Daemon::start_named(n, &args),
        None => Daemon::start(&args),
    };
    (d, ep, rep)
}

fn start(name: Option<&str>) -> (Daemon, String, String) {
    start_with(name, &[])
}

/// vLLM's `OffloadKey` in hex whose block hash ends in the 8 bytes of
/// `hash` (the rest zero), group `group`: its events carry `hash`.
fn offload_key(hash: u64, group: u32) -> Vec<u8> {
    format!("{hash:064x}{group:08x}").into_bytes()
}

/// The value of `key`.
fn value(key: &[u8]) -> Vec<u8> {
    let seed = xxhash_rust::xxh3::xxh3_64(key);
    (0..VALUE as usize)
        .map(|i| (seed.rotate_left((i % 61) as u32) as u8) ^ (i / 7) as u8)
        .collect()
}

/// Stores `keys` as one chain (each key's parent the key before it).
fn put_chain(c: &mut Client, ns: StoreNs, keys: &[Vec<u8>]) -> Vec<bool> {
    let values: Vec<Vec<u8>> = keys.iter().map(|k| value(k)).collect();
    let items: Vec<StoreItem<'_>> = keys
        .iter()
        .zip(&values)
        .enumerate()
        .map(|(i, (k, v))| StoreItem {
            key: k,
            parent: i.checked_sub(1).map(|p| keys[p].as_slice()),
            value: v,
        })
        .collect();
    c.store_put(ns, &items).expect("put")
}

/// What a subscriber replaying from 0 rebuilds.
#[derive(Debug, Default)]
struct Node {
    /// The store: block hash → the parent hash its event named.
    store: HashMap<u64, Option<u64>>,
    /// The device (the engine's pages): hashes.
    device: HashSet<u64>,
    /// Every batch, in order (for an index).
    batches: Vec<Batch>,
    /// Store blocks removed along the way.
    removed: usize,
}

/// Replays the stream from 0 and applies it, checking each store event's
/// shape.
fn replay(ep: &str, rep: &str) -> Node {
    let mut sub = Subscriber::connect(ep, "", Some(rep)).expect("subscribe");
    sub.replay_from(0, Duration::from_secs(20)).expect("replay");
    let mut node = Node::default();
    let mut seq = 0;
    while let Some(r) = sub.recv(Duration::from_millis(200)).expect("recv") {
        assert_eq!(r.seq, seq, "gapless from 0");
        seq += 1;
        for e in &r.batch.events {
            match e {
                KvEvent::BlockStored {
                    block_hashes,
                    parent_block_hash,
                    token_ids,
                    block_size,
                    lora_id,
                    medium,
                } if medium.as_deref() == Some(MEDIUM_STORE) => {
                    assert_eq!(block_hashes.len(), 1, "one value per event");
                    assert!(token_ids.is_empty(), "the store keeps no tokens");
                    assert_eq!(*block_size as usize, P);
                    assert_eq!(*lora_id, None);
                    if let Some(p) = parent_block_hash {
                        assert!(node.store.contains_key(p), "parent {p} not stored");
                    }
                    let old = node.store.insert(block_hashes[0], *parent_block_hash);
                    assert!(old.is_none(), "{} stored twice", block_hashes[0]);
                }
                KvEvent::BlockRemoved {
                    block_hashes,
                    medium,
                } if medium.as_deref() == Some(MEDIUM_STORE) => {
                    for h in block_hashes {
                        assert!(node.store.remove(h).is_some(), "removed {h} not stored");
                        node.removed += 1;
                    }
                }
                KvEvent::BlockStored { block_hashes, .. } => {
                    node.device.extend(block_hashes);
                }
                KvEvent::BlockRemoved { block_hashes, .. } => {
                    for h in block_hashes {
                        node.device.remove(h);
                    }
                }
                KvEvent::AllBlocksCleared => {
                    node.store.clear();
                    node.device.clear();
                }
            }
        }
        node.batches.push(r.batch);
    }
    node
}

/// Replays until the store rebuilt equals `want` (the publisher runs
/// beside the daemon: its last batches may still be on their way), with a
/// deadline.
fn replay_until(ep: &str, rep: &str, want: &HashSet<u64>) -> Node {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let node = replay(ep, rep);
        let got: HashSet<u64> = node.store.keys().copied().collect();
        if got == *want {
            return node;
        }
        assert!(
            Instant::now() < deadline,
            "the stream never rebuilt the store: {} blocks, want {}; missing {:?}, extra {:?}",
            got.len(),
            want.len(),
            want.difference(&got).take(5).collect::<Vec<_>>(),
            got.difference(want).take(5).collect::<Vec<_>>()
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// The hashes of every key of `keys` the store holds now.
fn held(c: &mut Client, ns: StoreNs, keys: &[Vec<u8>]) -> HashSet<u64> {
    keys.iter()
        .filter(|k| c.store_exists(ns, k).expect("exists"))
        .map(|k| store_block(k).hash)
        .collect()
}

/// Forty chains of four values (vLLM keys, SGLang-style hex digests and
/// plain names), more than the store holds: every chain's keys.
fn workload(c: &mut Client, ns: StoreNs) -> Vec<Vec<Vec<u8>>> {
    (0..40u64)
        .map(|chain| {
            let keys: Vec<Vec<u8>> = (0..4u64)
                .map(|i| {
                    let n = 1 + chain * 4 + i;
                    match chain % 3 {
                        0 => offload_key(n, (chain % 2) as u32),
                        1 => format!("{:064x}", n << 8).into_bytes(),
                        _ => format!("page-{n}").into_bytes(),
                    }
                })
                .collect();
            assert!(put_chain(c, ns, &keys).iter().all(|&b| b));
            keys
        })
        .collect()
}

/// Parents as the store linked them: each chain's value after the one
/// before it.
fn check_parents(node: &Node, chains: &[Vec<Vec<u8>>]) {
    for keys in chains {
        for (i, k) in keys.iter().enumerate() {
            let Some(parent) = node.store.get(&store_block(k).hash) else {
                continue;
            };
            let want = i.checked_sub(1).map(|p| store_block(&keys[p]).hash);
            // A value whose parent went before a snapshot has none.
            assert!(
                *parent == want || parent.is_none(),
                "parent of {:?}: {parent:?}, want {want:?}",
                String::from_utf8_lossy(k)
            );
        }
    }
}

/// Every raw `BlockStored` of medium CPU in the replay buffer, as msgpack
/// arrays (the default layout).
fn raw_store_events(rep: &str) -> Vec<Vec<Value>> {
    let ctx = zmq::Context::new();
    let dealer = ctx.socket(zmq::DEALER).expect("DEALER");
    dealer.connect(rep).expect("connect");
    let req: [&[u8]; 2] = [b"", &0u64.to_be_bytes()];
    dealer.send_multipart(req, 0).expect("send");
    let mut out = Vec::new();
    loop {
        assert!(
            dealer.poll(zmq::POLLIN, 10_000).expect("poll") > 0,
            "replay"
        );
        let frames = dealer.recv_multipart(0).expect("recv");
        if frames[1] == END_SEQ {
            return out;
        }
        let Ok(Value::Array(top)) = msgpack::decode(&frames[2]) else {
            panic!("a batch array");
        };
        let Some(Value::Array(events)) = top.get(1) else {
            panic!("events");
        };
        for e in events {
            if let Value::Array(f) = e {
                let cpu = matches!(f.get(6), Some(Value::Str(m)) if m == MEDIUM_STORE);
                if cpu && matches!(f.first(), Some(Value::Str(t)) if t == "BlockStored") {
                    out.push(f.clone());
                }
            }
        }
    }
}

#[test]
fn store_commits_and_evictions_are_published_as_cpu_blocks() {
    let (d, ep, rep) = start(None);
    let _sockets = sockets(&[&ep, &rep]);
    let _file = StoreFileGuard(radixd::store::file::store_path(&d.name));
    let mut c = Client::connect(&d.name).expect("connect");
    let ns = c.store_namespace("model-a", VALUE).expect("namespace");
    let chains = workload(&mut c, ns);
    let all: Vec<Vec<u8>> = chains.iter().flatten().cloned().collect();
    let want = held(&mut c, ns, &all);
    assert!(want.len() < all.len(), "the store evicted");
    let node = replay_until(&ep, &rep, &want);
    assert!(node.removed > 0, "evictions were published");
    assert_eq!(node.removed, all.len() - want.len());
    check_parents(&node, &chains);
    // Each key's hash as documented: a vLLM key's block hash and group.
    assert_eq!(store_block(&offload_key(7, 1)).hash, 7);
    assert_eq!(store_block(&offload_key(7, 1)).group_idx, Some(1));
    // vLLM keys carry their group as `group_idx` after a nil `extra_keys`;
    // other keys end at `lora_name`, as msgspec omits defaults.
    let raw = raw_store_events(&rep);
    assert_eq!(raw.len(), all.len(), "one BlockStored per commit");
    let mut groups = HashMap::new();
    for f in &raw {
        let Some(h) = f.get(1).and_then(|v| match v {
            Value::Array(h) => h.first().and_then(Value::as_u64),
            _ => None,
        }) else {
            panic!("block_hashes in {f:?}");
        };
        match f.len() {
            8 => {}
            10 => {
                assert_eq!(f[8], Value::Nil, "extra_keys");
                groups.insert(h, f[9].as_u64().expect("group_idx"));
            }
            n => panic!("a BlockStored of {n} fields: {f:?}"),
        }
    }
    for (chain, keys) in chains.iter().enumerate() {
        for k in keys {
            let want = (chain % 3 == 0).then_some((chain % 2) as u64);
            assert_eq!(groups.get(&store_block(k).hash).copied(), want);
        }
    }
}

#[test]
fn a_reset_and_an_adopting_daemon_announce_the_store_again() {
    let (mut d, ep, rep) = start(None);
    let _sockets = sockets(&[&ep, &rep]);
    let name = d.name.clone();
    let _file = StoreFileGuard(radixd::store::file::store_path(&name));
    let want = {
        let mut c = Client::connect(&name).expect("connect");
        let ns = c.store_namespace("model-a", VALUE).expect("namespace");
        let chains: Vec<Vec<Vec<u8>>> = (0..5u64)
            .map(|ch| {
                (0..3u64)
                    .map(|i| offload_key(100 + ch * 3 + i, 0))
                    .collect()
            })
            .collect();
        for keys in &chains {
            assert!(put_chain(&mut c, ns, keys).iter().all(|&b| b));
        }
        // Device pages too, which the reset drops.
        let pages = c.alloc(2).expect("alloc");
        c.insert(&[1, 2, 3, 4, 5, 6, 7, 8], &pages, false)
            .expect("insert");
        c.call(&Request::Reset).expect("reset");
        let all: Vec<Vec<u8>> = chains.iter().flatten().cloned().collect();
        let want = held(&mut c, ns, &all);
        assert_eq!(want.len(), 15);
        let node = replay_until(&ep, &rep, &want);
        assert!(node.device.is_empty(), "the reset cleared the device");
        check_parents(&node, &chains);
        // The whole stream: stored, cleared, stored again.
        let cleared = node
            .batches
            .iter()
            .flat_map(|b| &b.events)
            .position(|e| *e == KvEvent::AllBlocksCleared)
            .expect("AllBlocksCleared");
        let after = node
            .batches
            .iter()
            .flat_map(|b| &b.events)
            .skip(cleared)
            .filter(
                |e| matches!(e, KvEvent::BlockStored { medium: Some(m), .. } if m == MEDIUM_STORE),
            )
            .count();
        assert_eq!(after, 15, "the store announced again after the reset");
        want
    };
    d.kill(libc::SIGKILL);
    // The next daemon of the name adopts the store and announces it first.
    let (_d2, ep2, rep2) = start(Some(&name));
    let _sockets = sockets(&[&ep2, &rep2]);
    let node = replay_until(&ep2, &rep2, &want);
    assert_eq!(node.store.len(), 15);
    assert!(
        node.store.values().filter(|p| p.is_some()).count() == 10,
        "the adopted parent links: {:?}",
        node.store
    );
}

#[test]
fn clearing_a_namespace_publishes_its_removals() {
    let (d, ep, rep) = start(None);
    let _sockets = sockets(&[&ep, &rep]);
    let _file = StoreFileGuard(radixd::store::file::store_path(&d.name));
    let mut c = Client::connect(&d.name).expect("connect");
    let a = c.store_namespace("a", VALUE).expect("namespace");
    let b = c.store_namespace("b", VALUE).expect("namespace");
    let ka: Vec<Vec<u8>> = (0..4).map(|i| offload_key(500 + i, 0)).collect();
    let kb: Vec<Vec<u8>> = (0..4).map(|i| offload_key(600 + i, 0)).collect();
    put_chain(&mut c, a, &ka);
    put_chain(&mut c, b, &kb);
    assert_eq!(c.store_clear(a).expect("clear"), 4);
    let want = held(&mut c, b, &kb);
    assert_eq!(want.len(), 4);
    let node = replay_until(&ep, &rep, &want);
    assert_eq!(node.removed, 4);
}

#[test]
fn the_index_scores_a_nodes_store_hits_apart() {
    let (d, ep, rep) = start(None);
    let _sockets = sockets(&[&ep, &rep]);
    let _file = StoreFileGuard(radixd::store::file::store_path(&d.name));
    let mut c = Client::connect(&d.name).expect("connect");
    // A prompt of 4 pages: its first 2 cached on the device, all 4 in the
    // store under the keys a vLLM engine hashing as the index does would
    // use (the block hash's last 8 bytes are the index's key).
    let tokens: Vec<u32> = (1..=16).collect();
    let keys_of = Scheme::Xxh3.prompt(&tokens, P);
    let pages = c.alloc(2).expect("alloc");
    c.insert(&tokens[..8], &pages, false).expect("insert");
    let ns = c.store_namespace("model-a", VALUE).expect("namespace");
    let keys: Vec<Vec<u8>> = keys_of.iter().map(|&h| offload_key(h, 0)).collect();
    assert!(put_chain(&mut c, ns, &keys).iter().all(|&b| b));
    let want: HashSet<u64> = keys_of.iter().copied().collect();
    let node = replay_until(&ep, &rep, &want);

    let index = KvIndex::new(IndexConfig::xxh3(P as u32)).expect("index");
    for b in &node.batches {
        let report = index.apply(7, b);
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        assert_eq!(report.ignored, 0);
    }
    let w = Worker::new(7);
    let s = index.find_matches_for_tokens(&tokens, false);
    assert_eq!(s.score(w), Some(2), "the device holds 2 pages");
    assert_eq!(s.store_score(w), Some(4), "the store holds all 4");
    assert_eq!(s.tree_size(w), Some(2));
    assert_eq!(s.store_size(w), Some(4));
    assert_eq!(index.store_sizes(), vec![(w, 4)]);
    // Another prompt: neither tier.
    let other = index.find_matches_for_tokens(&[9; 16], false);
    assert_eq!((other.score(w), other.store_score(w)), (None, None));

    // The device evicts its pages: the node still holds the prompt in its
    // store, and the router sees it there.
    c.call(&Request::Evict { tokens: 1000 }).expect("evict");
    let node = replay_until(&ep, &rep, &want);
    assert!(node.device.is_empty());
    let index = KvIndex::new(IndexConfig::xxh3(P as u32)).expect("index");
    for b in &node.batches {
        index.apply(7, b);
    }
    let s = index.find_matches_for_tokens(&tokens, false);
    assert_eq!(s.score(w), None);
    assert_eq!(s.store_score(w), Some(4));
    assert_eq!(s.tree_size(w), Some(0), "known, its device empty");
}

/// Events of each medium go to their tier; another medium is skipped;
/// `AllBlocksCleared` and `remove_worker` take both tiers.
#[test]
fn the_index_keeps_each_medium_apart() {
    let index = KvIndex::new(IndexConfig::xxh3(P as u32)).expect("index");
    let w = Worker::new(1);
    let stored = |hashes: Vec<u64>, tokens: Vec<u32>, medium: &str| KvEvent::BlockStored {
        block_hashes: hashes,
        parent_block_hash: None,
        token_ids: tokens,
        block_size: P as u32,
        lora_id: None,
        medium: Some(medium.into()),
    };
    let tokens: Vec<u32> = (1..=8).collect();
    let keys = index.keys_for_tokens(&tokens);
    // The device holds the first page (from tokens); the store both pages
    // (named by hash, no tokens); a disk tier is skipped.
    assert_eq!(
        index.apply_event(w, &stored(vec![keys[0]], tokens[..4].to_vec(), "GPU")),
        Ok(true)
    );
    assert_eq!(
        index.apply_event(w, &stored(keys.clone(), vec![], "CPU")),
        Ok(true)
    );
    assert_eq!(
        index.apply_event(w, &stored(vec![99], vec![], "DISK")),
        Ok(false)
    );
    let s = index.find_matches(&keys, false);
    assert_eq!((s.score(w), s.store_score(w)), (Some(1), Some(2)));
    // A store block removed in the middle cuts the store's run.
    let removed = KvEvent::BlockRemoved {
        block_hashes: vec![keys[1]],
        medium: Some("CPU".into()),
    };
    assert_eq!(index.apply_event(w, &removed), Ok(true));
    let s = index.find_matches(&keys, false);
    assert_eq!((s.score(w), s.store_score(w)), (Some(1), Some(1)));
    // Without tokens the device tier still refuses a store.
    assert!(index
        .apply_event(w, &stored(vec![5], vec![], "GPU"))
        .is_err());
    assert_eq!(index.apply_event(w, &KvEvent::AllBlocksCleared), Ok(true));
    let s = index.find_matches(&keys, false);
    assert_eq!((s.score(w), s.store_score(w)), (None, None));
    assert_eq!((s.tree_size(w), s.store_size(w)), (Some(0), Some(0)));
    index
        .apply_event(w, &stored(keys.clone(), vec![], "CPU"))
        .expect("store");
    index.remove_worker(1);
    let s = index.find_matches(&keys, false);
    assert!(s.store_scores.is_empty() && s.store_sizes.is_empty() && s.tree_sizes.is_empty());
}

/// vLLM's structs (`vllm/distributed/kv_events.py`, every field through
/// `locality`) decode every message; store events are `CPU`, tokenless,
/// one block each.
const MSGSPEC_CHECK: &str = r#"
import sys, json
from typing import Any, Optional, Union
import msgspec, zmq

class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: Optional[int] = None
class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass
class BlockStored(KVCacheEvent):
    block_hashes: list[Union[bytes, int]]
    parent_block_hash: Optional[Union[bytes, int]]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str]
    extra_keys: Optional[list[Optional[tuple[Any, ...]]]] = None
    group_idx: Optional[int] = None
    kv_cache_spec_kind: Optional[str] = None
    kv_cache_spec_sliding_window: Optional[int] = None
    locality: Optional[str] = None
class BlockRemoved(KVCacheEvent):
    block_hashes: list[Union[bytes, int]]
    medium: Optional[str]
    group_idx: Optional[int] = None
class AllBlocksCleared(KVCacheEvent):
    pass
class KVEventBatch(EventBatch):
    events: list[Union[BlockStored, BlockRemoved, AllBlocksCleared]]

dec = msgspec.msgpack.Decoder(type=KVEventBatch)
ctx = zmq.Context()
dealer = ctx.socket(zmq.DEALER)
dealer.connect(sys.argv[1])
dealer.send_multipart([b"", (0).to_bytes(8, "big")])
stored, removed, groups = 0, 0, {}
while True:
    assert dealer.poll(10000)
    _, seq, payload = dealer.recv_multipart()
    if payload == b"":
        break
    for e in dec.decode(payload).events:
        if isinstance(e, BlockStored) and e.medium == "CPU":
            assert e.token_ids == [] and len(e.block_hashes) == 1, e
            stored += 1
            if e.group_idx is not None:
                groups[str(e.block_hashes[0])] = e.group_idx
        elif isinstance(e, BlockRemoved) and e.medium == "CPU":
            removed += len(e.block_hashes)
print(json.dumps({"stored": stored, "removed": removed, "groups": groups}), flush=True)
"#;

#[test]
fn vllm_msgspec_structs_decode_the_store_events() {
    let py = match std::env::var("RADIXD_PYTHON") {
        Ok(p) if !p.is_empty() => p,
        _ if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("RADIXD_PYTHON is unset under CI=true: run scripts/test")
        }
        _ => {
            eprintln!("notice: RADIXD_PYTHON unset, skipping the Python check");
            return;
        }
    };
    let (d, ep, rep) = start(None);
    let _sockets = sockets(&[&ep, &rep]);
    let _file = StoreFileGuard(radixd::store::file::store_path(&d.name));
    let mut c = Client::connect(&d.name).expect("connect");
    let ns = c.store_namespace("model-a", VALUE).expect("namespace");
    let chains = workload(&mut c, ns);
    let all: Vec<Vec<u8>> = chains.iter().flatten().cloned().collect();
    let want = held(&mut c, ns, &all);
    replay_until(&ep, &rep, &want);
    let mut child = Command::new(&py)
        .args(["-c", MSGSPEC_CHECK, &rep])
        .stdout(Stdio::piped())
        .spawn()
        .expect("python");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read");
    assert!(
        child.wait().expect("python").success(),
        "the msgspec check failed"
    );
    let v: serde_json::Value = serde_json::from_str(&line).expect("summary");
    assert_eq!(v["stored"].as_u64(), Some(all.len() as u64), "{v}");
    assert_eq!(v["removed"].as_u64(), Some((all.len() - want.len()) as u64));
    let h = store_block(&chains[3][0]).hash;
    assert_eq!(v["groups"][h.to_string()].as_u64(), Some(1), "{v}");
}

/// vLLM 0.33.0's own `KVEventBatch` (imported from vLLM) decodes every
/// message of `--kv-events-layout vllm`; store events are `CPU`, tokenless,
/// one block each, a vLLM key's group in `group_idx`.
const VLLM_CHECK: &str = r#"
import sys, json
import msgspec, zmq
from vllm.distributed.kv_events import KVEventBatch, BlockStored, BlockRemoved
dec = msgspec.msgpack.Decoder(type=KVEventBatch)
ctx = zmq.Context()
dealer = ctx.socket(zmq.DEALER)
dealer.connect(sys.argv[1])
dealer.send_multipart([b"", (0).to_bytes(8, "big")])
stored, removed, groups = 0, 0, {}
while True:
    assert dealer.poll(10000)
    _, seq, payload = dealer.recv_multipart()
    if payload == b"":
        break
    for e in dec.decode(payload).events:
        if isinstance(e, BlockStored) and e.medium == "CPU":
            assert e.token_ids == [] and len(e.block_hashes) == 1, e
            stored += 1
            if e.group_idx is not None:
                groups[str(e.block_hashes[0])] = e.group_idx
        elif isinstance(e, BlockRemoved) and e.medium == "CPU":
            removed += len(e.block_hashes)
print(json.dumps({"stored": stored, "removed": removed, "groups": groups}), flush=True)
"#;

/// With vLLM 0.33.0 itself, when `RADIXD_VLLM_PYTHON` names an interpreter
/// that has it (scripts/test-vllm's venv); skipped with a notice otherwise.
#[test]
fn vllm_s_own_kv_event_batch_decodes_the_vllm_layout() {
    let Some(py) = std::env::var("RADIXD_VLLM_PYTHON")
        .ok()
        .filter(|p| !p.is_empty())
    else {
        eprintln!("notice: RADIXD_VLLM_PYTHON unset, skipping the check with vLLM itself");
        return;
    };
    let (d, ep, rep) = start_with(None, &["--kv-events-layout", "vllm"]);
    let _sockets = sockets(&[&ep, &rep]);
    let _file = StoreFileGuard(radixd::store::file::store_path(&d.name));
    let mut c = Client::connect(&d.name).expect("connect");
    let ns = c.store_namespace("model-a", VALUE).expect("namespace");
    let chains = workload(&mut c, ns);
    let all: Vec<Vec<u8>> = chains.iter().flatten().cloned().collect();
    let want = held(&mut c, ns, &all);
    replay_until(&ep, &rep, &want);
    let out = Command::new(&py)
        .args(["-c", VLLM_CHECK, &rep])
        .stderr(Stdio::null())
        .output()
        .expect("python");
    assert!(out.status.success(), "vLLM's decoder failed");
    let line = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value =
        serde_json::from_str(line.lines().last().unwrap_or("")).expect("summary");
    assert_eq!(v["stored"].as_u64(), Some(all.len() as u64), "{v}");
    assert_eq!(v["removed"].as_u64(), Some((all.len() - want.len()) as u64));
    let h = store_block(&chains[3][0]).hash;
    assert_eq!(v["groups"][h.to_string()].as_u64(), Some(1), "{v}");
}

/// Kills a child process when dropped.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `radixd index serve` following a daemon with a store answers
/// `radixd index query` with the node's store scores beside its device's.
#[cfg(all(feature = "cli", feature = "index"))]
#[test]
fn index_serve_answers_store_scores() {
    let (d, ep, rep) = start(None);
    let _sockets = sockets(&[&ep, &rep]);
    let _file = StoreFileGuard(radixd::store::file::store_path(&d.name));
    let listen = format!("ipc:///tmp/radixd-store-ix-{}.q", std::process::id());
    let _listen = sockets(&[&listen]);
    let _index = Killed(
        Command::new(env!("CARGO_BIN_EXE_radixd"))
            .args(["index", "serve", "--listen", &listen, "--block-size", "4"])
            .args(["--subscribe", &format!("n0={ep}@{rep}")])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("radixd index serve"),
    );
    let mut c = Client::connect(&d.name).expect("connect");
    let tokens: Vec<u32> = (1..=16).collect();
    let pages = c.alloc(1).expect("alloc");
    c.insert(&tokens[..4], &pages, false).expect("insert");
    let ns = c.store_namespace("model-a", VALUE).expect("namespace");
    let keys: Vec<Vec<u8>> = Scheme::Xxh3
        .prompt(&tokens, P)
        .into_iter()
        .map(|h| offload_key(h, 0))
        .collect();
    assert!(put_chain(&mut c, ns, &keys).iter().all(|&b| b));
    let want = serde_json::json!({
        "ok": true,
        "scores": {"n0": 1},
        "tree_sizes": {"n0": 1},
        "store_scores": {"n0": 4},
        "store_sizes": {"n0": 4},
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = Command::new(env!("CARGO_BIN_EXE_radixd"))
            .args([
                "index",
                "query",
                "--connect",
                &listen,
                "--timeout-ms",
                "2000",
            ])
            .args(["--tokens", &serde_json::to_string(&tokens).expect("json")])
            .output()
            .expect("radixd index query");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let got: serde_json::Value = serde_json::from_str(text.trim()).unwrap_or_default();
        if got == want {
            break;
        }
        assert!(Instant::now() < deadline, "the index answered {text}");
        thread::sleep(Duration::from_millis(100));
    }
}
