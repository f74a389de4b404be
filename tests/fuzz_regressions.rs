//! What the cargo-fuzz targets (fuzz/, `scripts/fuzz`) found, kept as
//! plain tests so the root workspace's suite catches a regression without
//! nightly or libFuzzer.

use radixd::op::{ErrorKind, Request, Spare};
use radixd::wire;

/// `wire_request`: a record's `arg` on an op that takes none was ignored
/// (a `session_commit` with `arg` 0x1b00_0000_0000 decoded as if it were
/// 0, and so re-encoded to another record). Refused now, as stray `aux`
/// words and payload fields are.
#[test]
fn an_arg_on_an_op_that_takes_none_is_malformed() {
    let tokens: Vec<u32> = (1..=4).collect();
    let takes_none = [
        Request::SessionCommit {
            session: "s1".into(),
            tokens: tokens.clone(),
            pages: vec![0, 1],
        },
        Request::Match {
            tokens: tokens.clone(),
            lock: false,
        },
        Request::Insert {
            tokens: tokens.clone(),
            pages: vec![0, 1],
            lock: true,
        },
        Request::Free { pages: vec![1] },
        Request::Stats,
        Request::Bind {
            pool: "device=cuda:0".into(),
        },
        Request::Namespaced {
            ns: "t".into(),
            request: Box::new(Request::Match {
                tokens,
                lock: false,
            }),
        },
    ];
    let mut spare = Spare::default();
    for request in &takes_none {
        let e = wire::encode_request(request, 2, 64);
        let payload = e.payload();
        assert_eq!(
            wire::decode_request(&e.record, payload.as_slice(), &mut spare).as_ref(),
            Ok(request)
        );
        let mut record = e.record;
        record.arg = 0x1b00_0000_0000;
        let refused = wire::decode_request(&record, payload.as_slice(), &mut spare)
            .expect_err("a stray arg decoded");
        assert_eq!(
            refused.kind,
            ErrorKind::Malformed,
            "{request:?}: {refused:?}"
        );
    }
    // The ops that take one still do.
    for request in [
        Request::Alloc { n: 3 },
        Request::Evict { tokens: 8 },
        Request::FreeState { state: 2 },
    ] {
        let e = wire::encode_request(&request, 2, 64);
        assert_ne!(e.record.arg, 0);
        let payload = e.payload();
        assert_eq!(
            wire::decode_request(&e.record, payload.as_slice(), &mut spare),
            Ok(request)
        );
    }
}

/// `store_adopt`: a store file whose committed entries name each other as
/// parents (a cycle only a forged or garbled file has) was adopted with
/// both values inner nodes of the eviction order: never a leaf, never
/// evicted, their room lost until `--store-reset`. Adoption now cuts the
/// link that closes a cycle, so every adopted value can be evicted.
#[test]
fn an_adopted_parent_cycle_is_cut_and_every_value_evicts() {
    use radixd::store::{HeapStore, StoreConfig, StoreIndex, StoreItem};
    use radixd_ipc::sync::Ordering;

    let config = StoreConfig::for_size(1 << 20, 1).unwrap();
    let mut store = HeapStore::new(config).unwrap();
    let ns = store.index.namespace(b"kv", 64).unwrap();
    let items = [
        StoreItem {
            key: b"a",
            parent: None,
            value: &[1; 64],
        },
        StoreItem {
            key: b"b",
            parent: Some(b"a"),
            value: &[2; 64],
        },
    ];
    assert_eq!(store.put(ns, &items).unwrap(), [true, true]);
    let view = *store.index.view();
    let (a, b) = (
        store.reader.find(ns, b"a").unwrap().index,
        store.reader.find(ns, b"b").unwrap().index,
    );
    let entry = |i| view.entry(i).unwrap();
    assert_eq!(entry(b).parent.load(Ordering::Relaxed), a);
    // The forgery: `a`'s parent is `b`, at `b`'s generation.
    let generation = entry(b).generation.load(Ordering::Relaxed);
    entry(a).parent.store(b, Ordering::Relaxed);
    entry(a)
        .parent_generation
        .store(generation, Ordering::Relaxed);

    let mut adopted = StoreIndex::adopt(view).expect("a file with sound records");
    adopted.validate().unwrap();
    assert_eq!(adopted.figures().values, 2);
    let mut evicted = 0;
    while adopted.evict_one() {
        evicted += 1;
        assert!(evicted <= 2);
    }
    assert_eq!(evicted, 2, "values the cycle kept from every eviction");
    adopted.validate().unwrap();
}

/// `store_adopt`: a namespace's value size near `u64::MAX` (a forged store
/// file, or a client's request) overflowed the stride computation: a
/// panic in a debug build, a stride wrapped to a small one in release.
/// Refused now, from a client and in an adopted file alike.
#[test]
fn a_value_size_near_u64_max_is_refused() {
    use radixd::store::{HeapStore, StoreConfig, StoreIndex};
    use radixd_ipc::sync::Ordering;

    let config = StoreConfig::for_size(1 << 20, 1).unwrap();
    let mut store = HeapStore::new(config).unwrap();
    for size in [u64::MAX, u64::MAX - 10, u64::MAX - 4096] {
        assert!(store.index.namespace(b"huge", size).is_err(), "{size}");
    }
    store.index.namespace(b"kv", 64).unwrap();
    store.index.validate().unwrap();
    let view = *store.index.view();
    let forged = (0..)
        .map_while(|i| view.namespace(i))
        .find(|n| n.state.load(Ordering::Relaxed) == 1)
        .expect("the registered namespace");
    forged.value_size.store(u64::MAX - 10, Ordering::Relaxed);
    assert!(StoreIndex::adopt(view).is_err());
}
