//! Writes the seed corpora under `fuzz/corpus/<target>/`: a handful of
//! small valid inputs per target, made by radixd's own encoders and
//! layouts (so they follow the code, not a copy of its formats).
//!
//! `cargo +nightly run --manifest-path fuzz/Cargo.toml --example seeds`

use std::fs;
use std::path::{Path, PathBuf};

use radixd::engine::Anchor;
use radixd::op::{Join, KeyList, Request, StoreRequest};
use radixd::store::{StoreConfig, StoreLayout};
use radixd::wire::{self, WireRequest};
use radixd_ipc::segment::{HEADER_VERSION, MAGIC};

fn corpus(target: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    fs::create_dir_all(&dir).expect("the corpus directory");
    dir
}

fn write(target: &str, name: &str, bytes: &[u8]) {
    fs::write(corpus(target).join(name), bytes).expect("a seed written");
}

fn record_bytes(r: &WireRequest) -> Vec<u8> {
    let mut b = Vec::with_capacity(56);
    b.extend_from_slice(&r.seq.to_ne_bytes());
    b.extend_from_slice(&r.op.to_ne_bytes());
    b.extend_from_slice(&r.flags.to_ne_bytes());
    b.extend_from_slice(&r.arg.to_ne_bytes());
    for w in [
        r.payload_off,
        r.payload_len,
        r.n_tokens,
        r.n_pages,
        r.reply_off,
        r.reply_len,
        r.aux[0],
        r.aux[1],
    ] {
        b.extend_from_slice(&w.to_ne_bytes());
    }
    assert_eq!(b.len(), std::mem::size_of::<WireRequest>());
    b
}

fn wire_seeds() {
    let tokens: Vec<u32> = (1..=8).collect();
    let mut keys = KeyList::default();
    keys.push(b"k1", None);
    keys.push(b"k2", Some(b"k1"));
    let requests = [
        ("alloc", Request::Alloc { n: 2 }),
        (
            "insert",
            Request::Insert {
                tokens: tokens.clone(),
                pages: vec![0, 1, 2, 3],
                lock: true,
            },
        ),
        (
            "match",
            Request::Match {
                tokens: tokens.clone(),
                lock: false,
            },
        ),
        ("free", Request::Free { pages: vec![3] }),
        ("evict", Request::Evict { tokens: 4 }),
        (
            "session_commit",
            Request::SessionCommit {
                session: "s1".into(),
                tokens: tokens[..4].to_vec(),
                pages: vec![0, 1],
            },
        ),
        (
            "match_at",
            Request::MatchAt {
                anchor: Anchor {
                    node: 1,
                    generation: 1,
                    version: 2,
                    pages_into_node: 1,
                },
                matched_pages: 1,
                next_hash: Some(7),
                lock: true,
            },
        ),
        (
            "insert_with",
            Request::InsertWith {
                tokens: tokens[..4].to_vec(),
                pages: vec![0, 1],
                lock: false,
                mamba_state: Some(0),
                swa_evicted: 0,
            },
        ),
        (
            "evict_components",
            Request::EvictComponents {
                tokens: 2,
                swa_tokens: 2,
                mamba_states: 1,
            },
        ),
        (
            "bind",
            Request::Bind {
                pool: "device=cuda:0;server=h:1".into(),
            },
        ),
        (
            "join",
            Request::Join(Join {
                group: "g".into(),
                rank: 0,
                size: 2,
                page_size: 2,
            }),
        ),
        (
            "namespaced",
            Request::Namespaced {
                ns: "lora-1".into(),
                request: Box::new(Request::Match {
                    tokens: tokens.clone(),
                    lock: false,
                }),
            },
        ),
        ("walk", Request::Walk { tokens }),
        (
            "store_reserve",
            Request::Store(StoreRequest::Reserve { ns: 0, keys }),
        ),
        ("stats", Request::StatsWith),
    ];
    for (name, request) in &requests {
        let e = wire::encode_request(request, 2, 64);
        // Control 0: the record as it is (bit 7: a hybrid engine).
        let control = if matches!(
            request,
            Request::InsertWith { .. } | Request::EvictComponents { .. }
        ) {
            0x80
        } else {
            0
        };
        let mut b = vec![control];
        b.extend(record_bytes(&e.record));
        b.extend(e.payload());
        write("wire_request", name, &b);
    }
}

fn exec_seeds() {
    let full = [
        r#"{"op":"alloc","n":4}"#,
        r#"{"op":"insert","tokens":[1,2,3,4,5,6,7,8],"pages":[0,1,2,3],"lock":true}"#,
        r#"{"op":"match","tokens":[1,2,3,4,9],"lock":true}"#,
        r#"{"op":"unlock","handle":1}"#,
        r#"{"op":"session_commit","session":"s","tokens":[1,2],"pages":[0]}"#,
        r#"{"op":"session_status","session":"s"}"#,
        r#"{"op":"evict","tokens":4}"#,
        r#"{"op":"stats"}"#,
        r#"{"op":"validate"}"#,
    ];
    let hybrid = [
        r#"{"op":"alloc","n":2}"#,
        r#"{"op":"alloc_state"}"#,
        r#"{"op":"insert","tokens":[1,2,3,4],"pages":[0,1],"mamba_state":0}"#,
        r#"{"op":"match","tokens":[1,2,3,4],"lock":true}"#,
        r#"{"op":"evict","tokens":2,"swa_tokens":2,"mamba_states":1}"#,
        r#"{"op":"stats"}"#,
    ];
    let store = [
        r#"{"op":"store_put","ns":"kv","key":"a","parent":null,"data":"AAECAw=="}"#,
        r#"{"op":"store_put","ns":"kv","key":"b","parent":"a","data":"BAUGBw=="}"#,
        r#"{"op":"store_get","ns":"kv","key":"b"}"#,
        r#"{"op":"store_exists","ns":"kv","keys":["a","b","c"]}"#,
        r#"{"op":"store_stats"}"#,
        r#"{"op":"store_clear","ns":"kv"}"#,
    ];
    let other = [
        r#"{"op":"insert","ns":"t1","tokens":[1,2],"pages":[0]}"#,
        r#"{"op":"bind","pool":"device=cuda:0;server=h:1"}"#,
        r#"{"op":"join","group":"g","rank":0,"size":2}"#,
        r#"{"op":"lock","handle":12345}"#,
        r#"{"op":"reset"}"#,
    ];
    for (name, control, lines) in [
        ("full", 0u8, &full[..]),
        ("swa", 1, &hybrid[..]),
        ("mamba", 2, &hybrid[..]),
        ("store", 4, &store[..]),
        ("other", 0, &other[..]),
    ] {
        let mut b = vec![control];
        for line in lines {
            b.extend_from_slice(line.as_bytes());
            b.push(b'\n');
        }
        write("exec_line", name, &b);
    }
}

fn identity_seeds() {
    // SGLang's identity (docs/protocol.md): device, server, uuid, dtype, pages.
    let a = "device=cuda:0;server=10.0.0.1:30000;uuid=GPU-4e9f0f7a-8b1c-2d3e-4f50-617283940a1b;dtype=bfloat16;pages=262144";
    let a_reordered = "pages=262144;dtype=bfloat16;uuid=GPU-4e9f0f7a-8b1c-2d3e-4f50-617283940a1b;server=10.0.0.1:30000;device=cuda:0";
    let b = "device=cuda:1;server=10.0.0.1:30001;uuid=GPU-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9;dtype=bfloat16;pages=262144";
    // Steps: byte (bit 0: release; bits 1-2: client), then the text.
    let steps: [&[(u8, &str)]; 3] = [
        &[(0, a), (2, a_reordered), (4, b), (1, ""), (3, ""), (4, b)],
        &[(0, "server=a=b"), (2, "server=a=b;x=1"), (0, "junk")],
        &[(0, "a=1;;b=2"), (0, "K=v"), (2, "k=v;k=w"), (2, "k=v")],
    ];
    for (i, seq) in steps.iter().enumerate() {
        let mut bytes = Vec::new();
        for (j, (head, text)) in seq.iter().enumerate() {
            if j > 0 {
                bytes.push(0xff);
            }
            bytes.push(*head);
            bytes.extend_from_slice(text.as_bytes());
        }
        write("pool_identity", &format!("steps-{i}"), &bytes);
    }
}

fn store_seeds() {
    let config = StoreConfig::for_size(1 << 20, 2).expect("the target's store size");
    let l = StoreLayout::new(config).expect("a layout");
    let patch = |at: u64, bytes: &[u8]| {
        let mut p = (at as u32).to_le_bytes().to_vec();
        p.push(bytes.len() as u8);
        p.extend_from_slice(bytes);
        p
    };
    let entry = |i: u64, field: u64| l.entries_at + i * 320 + field;
    // Entry fields: version 0, state 4, ns 8, key_len 12, hash 16, data 24,
    // next 32, generation 36, parent 40, parent_generation 44.
    let seeds: [(&str, u8, Vec<u8>); 6] = [
        ("pristine", 0, Vec::new()),
        ("version", 0, patch(8, &2u64.to_le_bytes())),
        ("entry_state", 0, patch(entry(0, 4), &7u32.to_le_bytes())),
        (
            "entry_data",
            0,
            patch(entry(1, 24), &(1u64 << 19).to_le_bytes()),
        ),
        // Entry 0's parent: entry 1 (its child), at entry 1's generation.
        (
            "parent_cycle",
            0,
            patch(entry(0, 40), &[1, 0, 0, 0, 1, 0, 0, 0]),
        ),
        (
            "namespace_state",
            0,
            patch(l.namespaces_at, &0u32.to_le_bytes()),
        ),
    ];
    for (name, control, patches) in seeds {
        let mut b = vec![control];
        b.extend(patches);
        write("store_adopt", name, &b);
    }
}

fn segment_seeds() {
    let mut header = vec![0u8; 64];
    header[..8].copy_from_slice(&MAGIC.to_le_bytes());
    header[8..12].copy_from_slice(&HEADER_VERSION.to_le_bytes());
    header[48..52].copy_from_slice(&1u32.to_le_bytes());
    header.resize(256, 0);
    let region = |off: u32, len: u32| {
        let mut r = off.to_le_bytes().to_vec();
        r.extend_from_slice(&len.to_le_bytes());
        r
    };
    let seeds: [(&str, u8, Vec<u8>, Vec<u8>); 4] = [
        // A dead daemon's segment (hash and size forged), then a live one.
        ("stale", 0x0c, region(64, 64), header.clone()),
        ("live", 0x1c, region(200, 100), header.clone()),
        (
            "foreign",
            0x10,
            region(0, 8),
            b"another program's file\n".to_vec(),
        ),
        (
            "short",
            0x00,
            region(0, 0),
            MAGIC.to_le_bytes()[..5].to_vec(),
        ),
    ];
    for (name, control, region, file) in seeds {
        let mut b = vec![control];
        b.extend(region);
        b.extend(file);
        write("segment_adopt", name, &b);
    }
}

fn main() {
    wire_seeds();
    exec_seeds();
    identity_seeds();
    store_seeds();
    segment_seeds();
}
