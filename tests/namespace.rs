//! Namespaces in the engine: a prefix cached in one never matches in
//! another (SGLang's `RadixKey(extra_key=...)`), the default one behaves as
//! a tree without namespaces, eviction stays one LRU order over all of
//! them, and a lock-free reader sees exactly what the engine sees.

use radixd::engine::{Engine, NamespaceError, Region, TreeReader, MAX_NAMESPACE_LEN};

mod common;

use common::{engine, ok, A};

/// Caches `tokens` (whole pages) in namespace `ns` with fresh pages.
fn put(e: &mut Engine, ns: u32, tokens: &[u32]) -> usize {
    let n = tokens.len() / e.page_size() as usize;
    let pages = e.alloc(A, n as u64).expect("pages");
    e.with_namespace(ns, |e| e.insert(A, tokens, &pages, false))
        .expect("insert")
        .cached
}

fn matched(e: &mut Engine, ns: u32, tokens: &[u32]) -> (usize, Vec<u32>) {
    let mut pages = Vec::new();
    let m = e.with_namespace(ns, |e| e.match_prefix(A, tokens, false, &mut pages));
    (m.len, pages)
}

#[test]
fn namespaces_never_share_prefixes() {
    let mut e = engine(2, 64);
    let (lora, salt) = (e.namespace("lora-1").unwrap(), e.namespace("salt").unwrap());
    assert_ne!(lora, salt);
    assert_ne!(lora, 0);
    assert_eq!(e.namespace("lora-1"), Ok(lora), "a name keeps its id");
    put(&mut e, 0, &[1, 2, 3, 4]);
    assert_eq!(matched(&mut e, lora, &[1, 2, 3, 4]).0, 0);
    assert_eq!(matched(&mut e, salt, &[1, 2]).0, 0);
    // The same tokens cached in each namespace: three disjoint copies.
    assert_eq!(put(&mut e, lora, &[1, 2, 3, 4]), 0, "nothing cached there");
    assert_eq!(put(&mut e, salt, &[1, 2, 9, 9]), 0);
    let (d, l, s) = (
        matched(&mut e, 0, &[1, 2, 3, 4]),
        matched(&mut e, lora, &[1, 2, 3, 4]),
        matched(&mut e, salt, &[1, 2, 3, 4]),
    );
    assert_eq!((d.0, l.0, s.0), (4, 4, 2));
    assert!(d.1.iter().all(|p| !l.1.contains(p) && !s.1.contains(p)));
    // Splits and extensions stay inside their namespace.
    assert_eq!(put(&mut e, lora, &[1, 2, 7, 7]), 2);
    assert_eq!(matched(&mut e, 0, &[1, 2, 7, 7]).0, 2);
    assert_eq!(matched(&mut e, salt, &[1, 2, 7, 7]).0, 2);
    assert_eq!(matched(&mut e, lora, &[1, 2, 7, 7]).0, 4);
    ok(&e);
    let sizes: Vec<_> = e
        .namespace_sizes()
        .into_iter()
        .map(|s| (s.name, s.tokens))
        .collect();
    assert_eq!(
        sizes,
        [
            (None, 4),
            (Some("lora-1".to_owned()), 6),
            (Some("salt".to_owned()), 4)
        ]
    );
    // After the operation the engine is back in the default namespace.
    assert_eq!(e.peek(&[1, 2, 7, 7], &mut Vec::new()), 2);
}

#[test]
fn eviction_is_one_lru_across_namespaces() {
    let mut e = engine(1, 8);
    let ns = e.namespace("tenant").unwrap();
    put(&mut e, 0, &[1, 1]);
    put(&mut e, ns, &[2, 2]);
    put(&mut e, 0, &[3, 3]);
    matched(&mut e, 0, &[1, 1]);
    // Oldest first: the tenant's prefix, then [3, 3].
    assert_eq!(e.evict(2), 2);
    assert_eq!(matched(&mut e, ns, &[2, 2]).0, 0);
    assert_eq!(matched(&mut e, 0, &[1, 1]).0, 2);
    assert_eq!(e.evict(2), 2);
    assert_eq!(matched(&mut e, 0, &[3, 3]).0, 0);
    assert_eq!(matched(&mut e, 0, &[1, 1]).0, 2);
    ok(&e);
}

#[test]
fn bad_names_are_typed_errors_and_register_nothing() {
    let mut e = engine(1, 8);
    assert_eq!(e.namespace(""), Err(NamespaceError::Empty));
    let long = "x".repeat(MAX_NAMESPACE_LEN + 1);
    assert_eq!(
        e.namespace(&long),
        Err(NamespaceError::TooLong {
            len: MAX_NAMESPACE_LEN + 1
        })
    );
    assert!(NamespaceError::Empty.to_string().contains("1 to 256 bytes"));
    let longest = "x".repeat(MAX_NAMESPACE_LEN);
    assert_eq!(e.namespace(&longest), Ok(1), "no id went to a refused name");
    assert_eq!(e.namespace_name(1), Some(longest.as_str()));
    assert_eq!(e.namespace_name(0), None);
}

#[test]
fn a_reset_keeps_the_ids() {
    let mut e = engine(1, 8);
    let (a, b) = (e.namespace("a").unwrap(), e.namespace("b").unwrap());
    put(&mut e, b, &[5]);
    e.reset();
    assert_eq!((e.namespace("a"), e.namespace("b")), (Ok(a), Ok(b)));
    assert_eq!(matched(&mut e, b, &[5]).0, 0);
    ok(&e);
}

#[test]
fn a_tree_reader_peeks_in_a_namespace() {
    let mut e = engine(2, 64);
    let ns = e.namespace("lora").unwrap();
    put(&mut e, 0, &[1, 2, 3, 4, 5, 6]);
    put(&mut e, ns, &[1, 2, 3, 4, 9, 9]);
    put(&mut e, ns, &[7, 7]);
    let base = std::ptr::NonNull::new(e.region().as_ptr()).unwrap();
    // SAFETY: the engine's own heap region, alive and unchanged while read.
    let reader = unsafe { TreeReader::new(base, e.layout()) };
    for space in [0, ns, ns + 1] {
        for key in [
            &[1, 2, 3, 4, 5, 6, 8][..],
            &[1, 2, 3, 4, 9, 9],
            &[7, 7, 7],
            &[],
        ] {
            let (mut mine, mut theirs) = (Vec::new(), Vec::new());
            let len = reader.peek_in(space, key, &mut theirs);
            let want = e.with_namespace(space, |e| e.peek(key, &mut mine));
            assert_eq!(len, Some(want), "ns {space} {key:?}");
            assert_eq!(theirs, mine, "ns {space} {key:?}");
        }
    }
    assert_eq!(
        reader.peek_in(ns, &[1, 2, 3, 4, 5, 6], &mut Vec::new()),
        Some(4)
    );
    assert_eq!(reader.peek(&[7, 7], &mut Vec::new()), Some(0));
    // An anchor found in a namespace carries it: the anchored match agrees.
    let mut pages = Vec::new();
    let peeked = reader
        .peek_anchored_in(ns, &[1, 2, 3, 4, 9, 9], &mut pages)
        .unwrap();
    let anchor = peeked.anchor.expect("an anchor below the root");
    let m = e
        .match_at(A, &anchor, pages.len(), None, false, None)
        .unwrap();
    assert_eq!(m.len, 6);
    ok(&e);
}

/// Through a daemon: the Rust client's namespaced calls, a lock-free peek
/// in a namespace, the typed refusal of a bad name over the wire (nothing
/// changes), and `radixd stat`'s namespace sizes.
#[test]
fn a_daemon_keeps_namespaces_apart_for_its_clients() {
    use common::{assert_mentions, radixd, stdout_ok, Daemon};
    use radixd::op::ErrorKind;
    use radixd::{Client, ClientError};

    let daemon = Daemon::start(&["--page-size", "2", "--capacity", "32"]);
    let mut c = Client::connect(&daemon.name).unwrap();
    let mut other = Client::connect(&daemon.name).unwrap();
    let (a, b) = (c.alloc(2).unwrap(), c.alloc(3).unwrap());
    c.insert(&[1, 2, 3, 4], &a, false).unwrap();
    assert_eq!(
        c.insert_in("lora-1", &[1, 2, 3, 4, 5, 6], &b, false)
            .unwrap()
            .cached,
        0
    );
    // Another client finds each prefix in its own namespace only.
    assert_eq!(
        other
            .match_prefix(&[1, 2, 3, 4, 5, 6], false)
            .unwrap()
            .pages,
        a
    );
    let m = other
        .match_prefix_in("lora-1", &[1, 2, 3, 4, 5, 6, 7], true)
        .unwrap();
    assert_eq!((m.len, &m.pages), (6, &b));
    assert!(m.handle.is_some(), "a lock was asked for");
    assert_eq!(
        other
            .match_prefix_in("salt", &[1, 2, 3, 4], false)
            .unwrap()
            .len,
        0
    );
    assert_eq!(
        other.peek_in("lora-1", &[1, 2, 3, 4, 5, 6]).unwrap(),
        (6, b.clone())
    );
    assert_eq!(other.peek_in("salt", &[1, 2]).unwrap().0, 0);
    assert_eq!(other.peek(&[1, 2, 3, 4, 5, 6]).unwrap().0, 4);
    assert_eq!(
        c.namespace_id("lora-1").unwrap(),
        other.namespace_id("lora-1").unwrap()
    );
    // A session commits in a namespace.
    let s = c.alloc(1).unwrap();
    let r = c.session_commit_in("salt", "conv", &[9, 9], &s).unwrap();
    assert_eq!(r.cached, 0);
    assert_eq!(other.peek_in("salt", &[9, 9]).unwrap().0, 2);
    assert_eq!(other.peek(&[9, 9]).unwrap().0, 0);
    // Bad names: typed, and nothing changes.
    let before = c.stats().unwrap();
    let long = "x".repeat(MAX_NAMESPACE_LEN + 1);
    for name in ["", long.as_str()] {
        match c.match_prefix_in(name, &[1, 2], false) {
            Err(ClientError::Rejected(r)) => assert_eq!(r.kind, ErrorKind::BadNamespace),
            other => panic!("{other:?}"),
        }
        match c.namespace_id(name) {
            Err(ClientError::Rejected(r)) => assert_eq!(r.kind, ErrorKind::BadNamespace),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(c.stats().unwrap(), before);
    let out = radixd()
        .args(["stat", &daemon.name, "--interval", "0.01"])
        .output()
        .unwrap();
    let (lora, salt) = (
        c.namespace_id("lora-1").unwrap(),
        c.namespace_id("salt").unwrap(),
    );
    assert_mentions(
        &stdout_ok(&out),
        &[&format!(
            "namespaces  default 4 tokens; #{lora} 6 tokens; #{salt} 2 tokens"
        )],
    );
}

/// KV events: the same tokens cached in two namespaces hash differently
/// (so a router never mixes them), the default namespace hashes as before,
/// a `lora:ID:NAME` namespace carries vLLM's `lora_id` and `lora_name`, and
/// a resync snapshot names the namespaces again.
#[cfg(feature = "index")]
#[test]
fn kv_events_hash_each_namespace_apart_and_carry_lora_ids() {
    use radixd::engine::CacheEvent;
    use radixd::events::batch::{decode_batch, BatchLayout, KvEvent};
    use radixd::events::encode::{lora_of, EventEncoder};
    use radixd::events::hash::{Scheme, SchemeName};

    for name in [SchemeName::Xxh3, SchemeName::Sha256Cbor] {
        let scheme = Scheme::new(name, "0");
        let mut e = engine(2, 64);
        e.namespace("before-recording").unwrap();
        e.record_events(true);
        let lora = e.namespace("lora:7:sql").unwrap();
        let salt = e.namespace("tenant-a").unwrap();
        let key = [1, 2, 3, 4];
        for ns in [0, lora, salt] {
            put(&mut e, ns, &key);
        }
        let mut recorded = Vec::new();
        e.take_events(&mut recorded);
        assert_eq!(
            recorded[..3],
            [
                CacheEvent::Namespace {
                    id: 1,
                    name: "before-recording".into()
                },
                CacheEvent::Namespace {
                    id: lora,
                    name: "lora:7:sql".into()
                },
                CacheEvent::Namespace {
                    id: salt,
                    name: "tenant-a".into()
                },
            ]
        );
        let mut enc = EventEncoder::new(scheme.clone(), 2, "GPU", BatchLayout::Array);
        for ev in &recorded {
            enc.event(ev);
        }
        let batch = decode_batch(&enc.finish(0.0, 0)).unwrap();
        let stored: Vec<(Vec<u64>, Option<u64>, Option<u64>)> = batch
            .events
            .iter()
            .filter_map(|ev| match ev {
                KvEvent::BlockStored {
                    block_hashes,
                    parent_block_hash,
                    lora_id,
                    ..
                } => Some((block_hashes.clone(), *parent_block_hash, *lora_id)),
                _ => None,
            })
            .collect();
        assert_eq!(stored.len(), 3);
        assert_eq!(stored[0].0, scheme.prompt(&key, 2), "the default as before");
        let root = scheme.namespace_root("lora:7:sql");
        assert_eq!(stored[1].0, scheme.prompt_from(Some(root), &key, 2));
        assert_eq!(
            (stored[0].2, stored[1].2, stored[2].2),
            (None, Some(7), None)
        );
        assert!(stored.iter().all(|s| s.1.is_none()), "all at the root");
        for (i, a) in stored.iter().enumerate() {
            for b in &stored[i + 1..] {
                assert!(a.0.iter().all(|h| !b.0.contains(h)), "{a:?} {b:?}");
            }
        }
        // A resync snapshot names every namespace before its runs.
        let runs = e.cached_runs();
        assert!(matches!(runs[0], CacheEvent::Namespace { id: 1, .. }));
        assert_eq!(
            runs.iter()
                .filter(|r| matches!(r, CacheEvent::Namespace { .. }))
                .count(),
            3
        );
    }
    assert_eq!(lora_of("lora:7:sql"), Some((7, Some("sql".into()))));
    assert_eq!(lora_of("lora:12"), Some((12, None)));
    for other in ["lora:", "lora:x", "lora", "tenant", "lora:-1:a"] {
        assert_eq!(lora_of(other), None, "{other}");
    }
}
