//! Unit tests of the index, the reader and adoption, over heap stores.

use super::layout::{Namespace, NIL, PAGE};
use super::*;

fn store(entries: u32, extents: u64, extent: u64) -> HeapStore {
    HeapStore::new(StoreConfig {
        data_bytes: extents * extent,
        extent_bytes: extent,
        entries,
        clients: 4,
    })
    .unwrap()
}

fn value(key: &[u8], size: usize) -> Vec<u8> {
    let seed = xxhash_rust::xxh3::xxh3_64(key);
    (0..size)
        .map(|i| (seed.rotate_left(i as u32 % 64) as u8) ^ i as u8)
        .collect()
}

fn put(s: &mut HeapStore, ns: StoreNs, key: &[u8], parent: Option<&[u8]>) -> bool {
    let v = value(key, ns.value_size as usize);
    let item = StoreItem {
        key,
        parent,
        value: &v,
    };
    s.put(ns, &[item]).unwrap()[0]
}

fn get(s: &HeapStore, ns: StoreNs, key: &[u8]) -> Option<Vec<u8>> {
    let mut out = vec![0; ns.value_size as usize];
    s.get(ns, key, &mut out).then_some(out)
}

#[test]
fn put_get_dedup_and_run() {
    let mut s = store(64, 4, PAGE * 4);
    let ns = s.index.namespace(b"m", 100).unwrap();
    assert!(put(&mut s, ns, b"a", None));
    assert!(!put(&mut s, ns, b"a", None), "already stored");
    assert!(put(&mut s, ns, b"b", Some(b"a")));
    assert_eq!(get(&s, ns, b"a"), Some(value(b"a", 100)));
    assert_eq!(get(&s, ns, b"b"), Some(value(b"b", 100)));
    assert_eq!(get(&s, ns, b"c"), None);
    assert_eq!(s.reader.run(ns, &[&b"a"[..], b"b", b"c", b"a"]), 2);
    let other = s.index.namespace(b"n", 100).unwrap();
    assert_eq!(get(&s, other, b"a"), None, "namespaces do not share keys");
    let st = s.reader.stats();
    assert_eq!((st.values, st.bytes, st.hits, st.misses), (2, 200, 2, 2));
    assert_eq!(st.namespaces, 2);
    s.index.validate().unwrap();
}

#[test]
fn namespaces_fix_their_size_and_refuse_bad_input() {
    let mut s = store(64, 4, PAGE);
    let ns = s.index.namespace(b"m", 64).unwrap();
    assert_eq!(s.index.namespace(b"m", 64).unwrap(), ns);
    assert_eq!(
        s.index.namespace(b"m", 65),
        Err(StoreError::SizeMismatch {
            expected: 64,
            got: 65
        })
    );
    assert!(matches!(
        s.index.namespace(b"big", PAGE + 1),
        Err(StoreError::ValueTooLarge { .. })
    ));
    assert!(matches!(
        s.index.namespace(b"", 8),
        Err(StoreError::BadName { .. })
    ));
    assert_eq!(s.reader.namespace(b"m"), Some(ns));
    assert_eq!(s.reader.namespace_by_id(ns.id), Some(ns));
    let other = s.index.namespace(b"n", 128).unwrap();
    assert_eq!(s.reader.namespace_by_id(other.id), Some(other));
    assert_ne!(other.id, ns.id);
    assert_eq!(s.reader.namespace_by_id(other.id + 1), None, "free");
    assert_eq!(s.reader.namespace_by_id(u32::MAX), None, "out of range");
    let long = vec![b'k'; MAX_KEY + 1];
    assert_eq!(
        s.index.reserve(0, ns.id, &[&long], &[]),
        Err(StoreError::BadKey { len: MAX_KEY + 1 })
    );
    assert_eq!(
        s.index.reserve(0, ns.id, &[b""], &[]),
        Err(StoreError::BadKey { len: 0 })
    );
    let wrong = vec![0u8; 63];
    let item = StoreItem {
        key: b"k",
        parent: None,
        value: &wrong,
    };
    assert!(matches!(
        s.put(ns, &[item]),
        Err(StoreError::SizeMismatch { .. })
    ));
    assert_eq!(s.reader.stats().values, 0, "nothing changed");
    s.index.validate().unwrap();
}

#[test]
fn commits_and_aborts_only_what_the_client_reserved() {
    let mut s = store(64, 4, PAGE);
    let ns = s.index.namespace(b"m", 64).unwrap();
    let slots = s.index.reserve(1, ns.id, &[b"x", b"y"], &[]).unwrap();
    let (x, y) = (slots[0].unwrap(), slots[1].unwrap());
    assert_eq!(
        s.index.reserve(2, ns.id, &[b"x"], &[]).unwrap(),
        vec![None],
        "reserved by another client counts as there"
    );
    assert_eq!(
        s.index.commit(2, ns.id, &[x]),
        Err(StoreError::NotReserved { index: x.index })
    );
    assert_eq!(
        s.index.commit(1, ns.id, &[x, x]),
        Err(StoreError::NotReserved { index: x.index })
    );
    assert!(!s.reader.exists(ns, b"x"), "reserved is not readable");
    assert_eq!(s.index.commit(1, ns.id, &[x]), Ok(1));
    assert!(s.reader.exists(ns, b"x"));
    assert_eq!(s.index.release_client(1), 1, "y was still reserved");
    assert!(!s.reader.exists(ns, b"y"));
    assert_eq!(
        s.index.commit(1, ns.id, &[y]),
        Err(StoreError::NotReserved { index: y.index })
    );
    s.index.validate().unwrap();
    // Everything came back: the store fills up again to its entries.
    let keys: Vec<Vec<u8>> = (0..63u32).map(|i| i.to_le_bytes().to_vec()).collect();
    let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    let slots = s.index.reserve(3, ns.id, &refs, &[]).unwrap();
    assert!(slots.iter().all(Option::is_some));
    s.index.validate().unwrap();
}

#[test]
fn eviction_takes_the_least_recently_read_leaf_first() {
    // Room for 8 values (8 entries).
    let mut s = store(8, 2, PAGE);
    let ns = s.index.namespace(b"m", 64).unwrap();
    // A chain a0 <- a1 <- a2 and five lone values.
    assert!(put(&mut s, ns, b"a0", None));
    assert!(put(&mut s, ns, b"a1", Some(b"a0")));
    assert!(put(&mut s, ns, b"a2", Some(b"a1")));
    for k in [b"b0", b"b1", b"b2", b"b3", b"b4"] {
        assert!(put(&mut s, ns, k, None));
    }
    // Read b0: it becomes the most recent.
    assert!(get(&s, ns, b"b0").is_some());
    // The next put evicts the oldest leaf: a2 (a0 and a1 have children).
    assert!(put(&mut s, ns, b"c0", None));
    assert!(get(&s, ns, b"a2").is_none());
    assert!(get(&s, ns, b"a0").is_some() && get(&s, ns, b"a1").is_some());
    // Then b1 (b0 was read, a1 was read just now).
    assert!(put(&mut s, ns, b"c1", None));
    assert!(get(&s, ns, b"b1").is_none());
    assert!(get(&s, ns, b"b0").is_some());
    assert_eq!(s.reader.stats().evicted, 2);
    s.index.validate().unwrap();
}

#[test]
fn memory_moves_between_value_sizes() {
    // Two extents of one page: 64 slots of 64 bytes, or 4 of 1 KiB each.
    let mut s = store(256, 2, PAGE);
    let small = s.index.namespace(b"small", 64).unwrap();
    let big = s.index.namespace(b"big", 1024).unwrap();
    for i in 0..128u32 {
        assert!(put(&mut s, small, &i.to_le_bytes(), None));
    }
    // Both extents hold small values; a big one evicts until one empties.
    assert!(put(&mut s, big, b"B", None));
    assert_eq!(get(&s, big, b"B"), Some(value(b"B", 1024)));
    let kept = (0..128u32)
        .filter(|i| get(&s, small, &i.to_le_bytes()).is_some())
        .count();
    assert_eq!(kept, 64, "one extent went to the big values");
    s.index.validate().unwrap();
}

#[test]
fn a_store_full_of_reservations_refuses_and_changes_nothing() {
    let mut s = store(4, 1, PAGE);
    let ns = s.index.namespace(b"m", 64).unwrap();
    let held = s
        .index
        .reserve(1, ns.id, &[b"1", b"2", b"3", b"4"], &[])
        .unwrap();
    assert!(held.iter().all(Option::is_some));
    assert_eq!(
        s.index.reserve(2, ns.id, &[b"5"], &[]),
        Err(StoreError::StoreFull { needed: 1 })
    );
    assert_eq!(s.reader.stats().failed_reserves, 1);
    s.index.validate().unwrap();
}

#[test]
fn adoption_rebuilds_and_refuses_garbage() {
    let mut s = store(64, 4, PAGE);
    let ns = s.index.namespace(b"m", 100).unwrap();
    for i in 0..20u32 {
        let parent = (i > 0).then(|| (i - 1).to_le_bytes());
        assert!(put(
            &mut s,
            ns,
            &i.to_le_bytes(),
            parent.as_ref().map(|p| &p[..])
        ));
    }
    let half = s.index.reserve(0, ns.id, &[b"half"], &[]).unwrap()[0].unwrap();
    let view = *s.index.view();
    let adopted = StoreIndex::adopt(view).unwrap();
    adopted.validate().unwrap();
    assert_eq!(adopted.figures().values, 20);
    assert!(!adopted.contains(ns.id, b"half"), "reserved is dropped");
    let reader = StoreReader::new(view, 0);
    for i in 0..20u32 {
        assert!(reader.exists(ns, &i.to_le_bytes()));
    }
    // Garbage in an entry: a data offset off the grid.
    let e = view.entry(3).unwrap();
    use radixd_ipc::sync::Ordering;
    let at = e.data.load(Ordering::Relaxed);
    e.data.store(at + 1, Ordering::Relaxed);
    assert!(matches!(
        StoreIndex::adopt(view),
        Err(AdoptError::Entry { index: 3, .. })
    ));
    e.data.store(at, Ordering::Relaxed);
    e.parent.store(NIL - 1, Ordering::Relaxed);
    assert!(StoreIndex::adopt(view).is_err());
    e.parent.store(NIL, Ordering::Relaxed);
    view.header().magic.store(7, Ordering::Relaxed);
    assert_eq!(StoreIndex::adopt(view).err(), Some(AdoptError::Magic));
    let _ = half;
}

#[test]
fn a_copy_of_an_entry_evicted_and_reused_under_it_is_thrown_away() {
    // One entry: the next put evicts the value a reader has found and
    // reuses its entry and slot for another key (the interleaving of an
    // expired reader; no grace period here).
    let mut s = store(1, 1, PAGE);
    let ns = s.index.namespace(b"m", 64).unwrap();
    assert!(put(&mut s, ns, b"old", None));
    let found = s.reader.find(ns, b"old").unwrap();
    assert!(put(&mut s, ns, b"new", None));
    assert_eq!(
        s.reader.find(ns, b"new").unwrap().data,
        found.data,
        "slot reused"
    );
    let mut out = vec![0u8; 64];
    let pieces = [(out.as_mut_ptr(), out.len())];
    // SAFETY: `out` is a live buffer of the pieces' length.
    let kept = unsafe { s.reader.copy_found(ns, found, &pieces, 1) };
    assert!(!kept, "the version moved: the copy (of \"new\") is refused");
    assert_eq!(out, value(b"new", 64), "what was copied was the new key's");
    // Before any change the same copy is kept.
    let found = s.reader.find(ns, b"new").unwrap();
    // SAFETY: as above.
    assert!(unsafe { s.reader.copy_found(ns, found, &pieces, 2) });
    assert_eq!(out, value(b"new", 64));
}

#[test]
fn clear_drops_one_namespace_and_leaves_reservations_alone() {
    let mut s = store(64, 4, PAGE);
    let a = s.index.namespace(b"a", 64).unwrap();
    let b = s.index.namespace(b"b", 128).unwrap();
    assert!(put(&mut s, a, b"1", None));
    assert!(put(&mut s, a, b"2", Some(b"1")));
    assert!(put(&mut s, a, b"3", Some(b"2")));
    assert!(put(&mut s, b, b"1", None));
    // A value of `a` reserved by client 5, not committed yet.
    let held = s.index.reserve(5, a.id, &[b"4"], &[Some(b"3")]).unwrap()[0].unwrap();
    assert_eq!(s.index.clear(a.id), Ok(3));
    assert_eq!(s.reader.run(a, &[&b"1"[..], b"2", b"3"]), 0);
    assert_eq!(get(&s, b, b"1"), Some(value(b"1", 128)), "b keeps its own");
    let st = s.reader.stats();
    assert_eq!((st.values, st.bytes), (1, 128));
    // The reservation is still the client's: it commits.
    assert_eq!(s.index.commit(5, a.id, &[held]), Ok(1));
    assert!(s.reader.exists(a, b"4"));
    s.index.validate().unwrap();
    assert_eq!(s.index.clear(b.id), Ok(1));
    assert_eq!(s.index.clear(b.id), Ok(0), "nothing left");
    assert_eq!(
        s.index.clear(9),
        Err(StoreError::UnknownNamespace { ns: 9 })
    );
    s.index.validate().unwrap();
    // What was cleared is room again: the store fills to its 64 entries.
    let keys: Vec<Vec<u8>> = (0..63u32).map(|i| i.to_le_bytes().to_vec()).collect();
    let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    let slots = s.index.reserve(6, b.id, &refs, &[]).unwrap();
    assert!(slots.iter().all(Option::is_some));
    s.index.validate().unwrap();
}

#[test]
fn the_longest_name_and_key_are_found_and_lengths_tell_them_apart() {
    use super::layout::{MAX_KEY, MAX_NAME};
    let mut s = store(64, 4, PAGE);
    let long = vec![b'n'; MAX_NAME];
    let ns = s.index.namespace(&long, 64).unwrap();
    assert_eq!(
        s.reader.namespace(&long),
        Some(ns),
        "a name of MAX_NAME bytes"
    );
    let short = s.index.namespace(b"ns", 64).unwrap();
    assert_eq!(s.reader.namespace(b"ns"), Some(short));
    // Names and keys are compared as zero-padded words: their lengths
    // tell "ns" from "ns\0".
    assert_eq!(s.reader.namespace(b"ns\0"), None);
    let key = vec![7u8; MAX_KEY];
    assert!(put(&mut s, ns, &key, None));
    assert!(s.reader.find(ns, &key).is_some(), "a key of MAX_KEY bytes");
    assert_eq!(get(&s, ns, &key), Some(value(&key, 64)));
    assert!(put(&mut s, short, b"k", None));
    assert!(s.reader.find(short, b"k").is_some());
    assert!(s.reader.find(short, b"k\0").is_none());
    s.index.validate().unwrap();
}

#[test]
fn the_records_lie_where_the_layout_puts_them() {
    use super::layout::NAMESPACES;
    let s = store(64, 4, PAGE);
    let v = s.reader.view();
    let l = v.layout();
    // The heap store's two parts are one allocation, as the file is one
    // file: every record's address from the header is its file offset.
    let base = v.header() as *const _ as usize;
    let at = |p: usize| (p - base) as u64;
    assert_eq!(at(v.clock() as *const _ as usize), l.clock_at);
    assert_eq!(
        at(v.counters(1).unwrap() as *const _ as usize),
        l.counters_at + 64
    );
    assert_eq!(
        at(v.stamp(3).unwrap() as *const _ as usize),
        l.stamps_at + 24
    );
    assert_eq!(
        at(v.namespace(NAMESPACES - 1).unwrap() as *const _ as usize),
        l.namespaces_at + u64::from(NAMESPACES - 1) * std::mem::size_of::<Namespace>() as u64
    );
    assert!(v.namespace(NAMESPACES).is_none(), "past the last namespace");
    assert_eq!(
        at(v.bucket_at(l.buckets - 1).unwrap() as *const _ as usize),
        l.buckets_at + u64::from(l.buckets - 1) * 4
    );
    assert!(v.bucket_at(l.buckets).is_none(), "past the last bucket");
    assert!(v.entry(l.config.entries - 1).is_some());
    assert!(v.entry(l.config.entries).is_none(), "past the last entry");
}

#[test]
fn events_are_recorded_only_while_on_and_stopping_drops_the_log() {
    let mut s = store(64, 4, PAGE);
    assert!(!s.index.recording());
    let ns = s.index.namespace(b"m", 64).unwrap();
    assert!(put(&mut s, ns, b"a", None));
    let mut out = Vec::new();
    s.index.take_events(&mut out);
    assert!(out.is_empty(), "nothing is recorded while off");
    s.index.record_events(true);
    assert!(s.index.recording());
    assert!(put(&mut s, ns, b"b", Some(b"a")));
    s.index.take_events(&mut out);
    let stored = StoreEvent::Stored {
        ns: ns.id(),
        key: b"b".to_vec(),
        parent: Some(b"a".to_vec()),
    };
    assert_eq!(out, vec![stored]);
    assert!(put(&mut s, ns, b"c", None));
    s.index.record_events(false);
    assert!(!s.index.recording());
    s.index.record_events(true);
    out.clear();
    s.index.take_events(&mut out);
    assert!(out.is_empty(), "stopping dropped what was recorded");
}

#[test]
fn events_name_namespace_whole_key_parent_and_removal_and_a_snapshot_orders_parents_first() {
    use super::layout::MAX_KEY;
    let mut s = store(8, 2, PAGE);
    // A third namespace, so that its id is neither 0 nor 1.
    s.index.namespace(b"x", 64).unwrap();
    s.index.namespace(b"y", 64).unwrap();
    let ns = s.index.namespace(b"m", 64).unwrap();
    assert!(ns.id() > 1);
    // Values before the recorded ones, so that no entry of interest is
    // entry 0 or 1.
    assert!(put(&mut s, ns, b"p0", None));
    assert!(put(&mut s, ns, b"p1", None));
    s.index.record_events(true);
    let long = vec![7u8; MAX_KEY];
    assert!(put(&mut s, ns, b"a0", None));
    assert!(put(&mut s, ns, &long, Some(b"a0")));
    assert!(put(&mut s, ns, b"a2", Some(&long)));
    let mut out = Vec::new();
    s.index.take_events(&mut out);
    let stored = |key: &[u8], parent: Option<&[u8]>| StoreEvent::Stored {
        ns: ns.id(),
        key: key.to_vec(),
        parent: parent.map(<[u8]>::to_vec),
    };
    assert_eq!(
        out,
        vec![
            stored(b"a0", None),
            stored(&long, Some(b"a0")),
            stored(b"a2", Some(&long))
        ]
    );
    // A snapshot: every committed value, each parent before its children.
    let snap = s.index.snapshot();
    assert_eq!(snap.len(), 5);
    for (i, e) in snap.iter().enumerate() {
        let StoreEvent::Stored { parent, .. } = e else {
            panic!("a snapshot holds Stored facts only: {e:?}");
        };
        if let Some(p) = parent {
            let at = snap
                .iter()
                .position(|f| matches!(f, StoreEvent::Stored { key, .. } if key == p));
            assert!(at.is_some_and(|at| at < i), "{e:?} before its parent");
        }
    }
    assert!(snap.contains(&stored(b"a2", Some(&long))));
    assert!(snap.contains(&stored(b"p0", None)));
    // Eviction takes the least recently read leaf (p0), then clear takes
    // the rest: each announced as Removed.
    assert!(s.index.evict_one());
    out.clear();
    s.index.take_events(&mut out);
    let removed = |key: &[u8]| StoreEvent::Removed {
        ns: ns.id(),
        key: key.to_vec(),
    };
    assert_eq!(out, vec![removed(b"p0")]);
    assert_eq!(s.index.clear(ns.id()), Ok(4));
    out.clear();
    s.index.take_events(&mut out);
    assert_eq!(out.len(), 4);
    for key in [&b"p1"[..], b"a0", &long, b"a2"] {
        assert!(out.contains(&removed(key)), "{key:?} announced gone");
    }
    assert!(s.index.snapshot().is_empty());
}

/// A store of 4 extents of a page, each holding 2 values of 1,500 bytes
/// (stride 1,536: a partial slot at each extent's end), 6 of them stored.
fn adoptable() -> (HeapStore, StoreNs) {
    let mut s = store(64, 4, PAGE);
    let ns = s.index.namespace(b"m", 1500).unwrap();
    for i in 0..6u8 {
        assert!(put(&mut s, ns, &[i], None));
    }
    (s, ns)
}

/// The entry holding one-byte key `key`.
fn entry_of(view: &StoreView, key: u8) -> &super::layout::Entry {
    use radixd_ipc::sync::Ordering::Relaxed;
    (0..64)
        .filter_map(|i| view.entry(i))
        .find(|e| {
            e.state.load(Relaxed) == super::layout::COMMITTED
                && e.key_len.load(Relaxed) == 1
                && e.key[0].load(Relaxed) == u64::from(key)
        })
        .unwrap()
}

/// What adopting [`adoptable`] answers once `forge` wrote into it.
fn forged(forge: impl Fn(&StoreView)) -> AdoptError {
    let (s, _) = adoptable();
    let view = *s.index.view();
    StoreIndex::adopt(view).expect("the store as written");
    forge(&view);
    StoreIndex::adopt(view)
        .err()
        .expect("a forged store adopted")
}

#[test]
fn adoption_refuses_each_forged_field() {
    use super::layout::{MAX_KEY, MAX_NAME};
    use radixd_ipc::sync::Ordering::Relaxed;
    let ns_bad = |why| AdoptError::Namespace { index: 0, why };
    let header = forged(|v| {
        let h = v.header();
        h.file_bytes.fetch_add(1, Relaxed);
    });
    assert!(matches!(header, AdoptError::Header(_)), "{header:?}");
    let name = "bad name length";
    assert_eq!(
        forged(|v| v.namespace(0).unwrap().name_len.store(0, Relaxed)),
        ns_bad(name)
    );
    let too_long = MAX_NAME as u32 + 1;
    assert_eq!(
        forged(|v| v.namespace(0).unwrap().name_len.store(too_long, Relaxed)),
        ns_bad(name)
    );
    let size = "value size does not fit an extent";
    assert_eq!(
        forged(|v| v.namespace(0).unwrap().value_size.store(0, Relaxed)),
        ns_bad(size)
    );
    assert_eq!(
        forged(|v| v.namespace(0).unwrap().value_size.store(PAGE + 1, Relaxed)),
        ns_bad(size)
    );
    // A second record of the same name.
    let twice = forged(|v| {
        let (a, b) = (v.namespace(0).unwrap(), v.namespace(1).unwrap());
        for (x, y) in a.name.iter().zip(&b.name) {
            y.store(x.load(Relaxed), Relaxed);
        }
        b.name_len.store(a.name_len.load(Relaxed), Relaxed);
        b.value_size.store(a.value_size.load(Relaxed), Relaxed);
        b.state.store(1, Relaxed);
    });
    assert_eq!(
        twice,
        AdoptError::Namespace {
            index: 1,
            why: "name registered twice"
        }
    );
    let entry =
        |why| move |e: AdoptError| matches!(e, AdoptError::Entry { why: w, .. } if w == why);
    let key = entry("bad key length");
    assert!(key(forged(|v| entry_of(v, 2).key_len.store(0, Relaxed))));
    assert!(key(forged(|v| entry_of(v, 2)
        .key_len
        .store(MAX_KEY as u32 + 1, Relaxed))));
    // The partial slot at an extent's end: on the grid, past the last slot.
    let grid = forged(|v| {
        let e = entry_of(v, 3);
        let extent = e.data.load(Relaxed) / PAGE;
        e.data.store(extent * PAGE + 2 * 1536, Relaxed);
    });
    assert!(entry("data offset off the slot grid")(grid));
    // Two entries on one slot.
    let shared = forged(|v| {
        let at = entry_of(v, 1).data.load(Relaxed);
        entry_of(v, 4).data.store(at, Relaxed);
    });
    assert_eq!(
        shared,
        AdoptError::Entry {
            index: NIL,
            why: "two entries share a data slot"
        }
    );
}

#[test]
fn adoption_takes_the_longest_name_and_key_and_the_largest_value_and_drops_a_torn_entry() {
    use super::layout::{MAX_KEY, MAX_NAME};
    let (mut s, ns) = adoptable();
    // A value as large as an extent, under the longest name and key.
    let big = s.index.namespace(&[b'n'; MAX_NAME], PAGE).unwrap();
    let long = [9u8; MAX_KEY];
    assert!(put(&mut s, big, &long, None));
    let view = *s.index.view();
    // A value whose record the daemon was changing when it died.
    entry_of(&view, 5).version.begin();
    let adopted = StoreIndex::adopt(view).unwrap();
    adopted.validate().unwrap();
    assert!(adopted.contains(big.id(), &long));
    assert!(adopted.contains(ns.id(), &[4]));
    assert!(!adopted.contains(ns.id(), &[5]), "a torn record is dropped");
    assert_eq!(adopted.figures().values, 6);
}

#[test]
fn an_adopted_store_fills_its_free_slots_without_overwriting_a_value() {
    let (mut s, ns) = adoptable();
    let view = *s.index.view();
    s.index = StoreIndex::adopt(view).unwrap();
    // Two slots were free: both are taken, and no value stored before
    // adoption changes.
    assert!(put(&mut s, ns, &[6], None));
    assert!(put(&mut s, ns, &[7], None));
    assert_eq!(s.reader.stats().evicted, 0);
    for i in 0..8u8 {
        assert_eq!(get(&s, ns, &[i]), Some(value(&[i], 1500)), "key {i}");
    }
    s.index.validate().unwrap();
    // Full now: the next value evicts one, and lands on its slot only.
    assert!(put(&mut s, ns, &[8], None));
    assert_eq!(s.reader.stats().evicted, 1);
    let kept = (0..9u8).filter(|&i| get(&s, ns, &[i]) == Some(value(&[i], 1500)));
    assert_eq!(kept.count(), 8);
    s.index.validate().unwrap();
}

#[test]
fn an_adopted_half_full_extent_takes_the_next_value() {
    // 7 values: three extents full, one holding a single value.
    let (mut s, ns) = adoptable();
    assert!(put(&mut s, ns, &[6], None));
    let view = *s.index.view();
    s.index = StoreIndex::adopt(view).unwrap();
    assert_eq!(s.index.figures().values, 7);
    assert_eq!(s.index.figures().bytes, 7 * 1500);
    assert!(put(&mut s, ns, &[7], None));
    assert_eq!(s.reader.stats().evicted, 0, "a free slot was left");
    for i in 0..8u8 {
        assert_eq!(get(&s, ns, &[i]), Some(value(&[i], 1500)), "key {i}");
    }
}

#[test]
fn adoption_breaks_a_forged_parent_cycle() {
    use radixd_ipc::sync::Ordering::Relaxed;
    // [10] <- [11], then [10]'s parent forged as [11]: a cycle, neither
    // ever a leaf. Adoption drops the link that closes it, so eviction
    // reaches both.
    let mut s = store(64, 4, PAGE);
    let ns = s.index.namespace(b"m", 1500).unwrap();
    assert!(put(&mut s, ns, &[10], None));
    assert!(put(&mut s, ns, &[11], Some(&[10])));
    let view = *s.index.view();
    let (a, b) = (entry_of(&view, 10), entry_of(&view, 11));
    let b_index = (0..64)
        .find(|&i| std::ptr::eq(view.entry(i).unwrap(), b))
        .unwrap();
    a.parent.store(b_index, Relaxed);
    a.parent_generation
        .store(b.parent_generation.load(Relaxed), Relaxed);
    let mut index = StoreIndex::adopt(view).unwrap();
    index.validate().unwrap();
    assert!(index.evict_one() && index.evict_one(), "both are evictable");
    assert!(!index.evict_one());
    assert_eq!(index.figures().values, 0);
}

#[test]
fn adoption_keeps_a_live_parent_link_and_drops_a_stale_one() {
    use radixd_ipc::sync::Ordering::Relaxed;
    // A chain [10] <- [11]: adopted, [11] is the only leaf, so eviction
    // takes it though [10] is older; with its link stale, [10] is a leaf
    // too and goes first.
    let adopt = |forge: &dyn Fn(&StoreView)| {
        let mut s = store(64, 4, PAGE);
        let ns = s.index.namespace(b"m", 1500).unwrap();
        assert!(put(&mut s, ns, &[10], None));
        assert!(put(&mut s, ns, &[11], Some(&[10])));
        let view = *s.index.view();
        forge(&view);
        let mut index = StoreIndex::adopt(view).unwrap();
        index.validate().unwrap();
        let snapshot = index.snapshot();
        assert!(index.evict_one());
        let kept = (
            index.contains(ns.id(), &[10]),
            index.contains(ns.id(), &[11]),
        );
        (snapshot, kept)
    };
    let stored = |key: u8, parent: Option<u8>| StoreEvent::Stored {
        ns: 0,
        key: vec![key],
        parent: parent.map(|p| vec![p]),
    };
    let (snapshot, kept) = adopt(&|_| {});
    assert_eq!(snapshot, vec![stored(10, None), stored(11, Some(10))]);
    assert_eq!(kept, (true, false), "the child is the leaf");
    let (snapshot, kept) = adopt(&|v| {
        entry_of(v, 11).parent_generation.fetch_add(1, Relaxed);
    });
    assert!(snapshot.contains(&stored(11, None)), "{snapshot:?}");
    assert_eq!(kept, (false, true), "both are leaves; the older goes");
}

#[test]
fn owners_of_other_slots_or_claims_differ() {
    let all = [
        owner(0, 0),
        owner(0, 1),
        owner(1, 0),
        owner(3, 7),
        owner(3, 8),
        owner(4, 7),
    ];
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            assert_ne!(a, b);
        }
    }
    assert_eq!(owner(3, 7) >> 32, 3, "the slot in the high word");
}

/// A grace period that readers hold while `held` is set.
struct Held(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl crate::engine::Grace for Held {
    fn epoch(&self) -> u64 {
        0
    }
    fn try_advance(&mut self) -> bool {
        !self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
    fn reusable(&self, _tag: u64) -> bool {
        !self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[test]
fn an_evicted_value_waits_in_limbo_while_a_reader_may_copy_it() {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    use std::sync::Arc;
    let held = Arc::new(AtomicBool::new(true));
    let (mut s, ns) = adoptable();
    s.index.set_grace(Box::new(Held(held.clone())));
    assert!(put(&mut s, ns, &[6], None));
    assert!(put(&mut s, ns, &[7], None));
    assert_eq!(s.index.in_limbo(), 0);
    // Full: what eviction takes waits in limbo while the reader holds,
    // and comes back once it lets go.
    assert!(s.index.evict_one());
    assert_eq!(s.index.in_limbo(), 1);
    s.index.validate().unwrap();
    held.store(false, Relaxed);
    assert_eq!(s.index.reclaim(), 1);
    assert_eq!(s.index.in_limbo(), 0);
    s.index.validate().unwrap();
    assert!(put(&mut s, ns, &[8], None));
}

#[test]
fn a_new_claim_starts_its_counters_at_zero_and_the_totals_keep_them() {
    let (mut s, ns) = adoptable();
    let view = *s.index.view();
    let client = StoreReader::new(view, 2);
    assert_eq!(client.run(ns, &[[1u8], [2], [9]]), 2);
    client.count(2, 1);
    let before = client.stats();
    assert_eq!((before.client_hits, before.client_misses), (2, 1));
    s.index.reset_counters(2);
    let after = client.stats();
    assert_eq!((after.client_hits, after.client_misses), (0, 0));
    assert_eq!((after.hits, after.misses), (before.hits, before.misses));
}

#[test]
fn validate_finds_a_looping_chain() {
    use radixd_ipc::sync::Ordering::Relaxed;
    let (s, _) = adoptable();
    s.index.validate().unwrap();
    let view = *s.index.view();
    let e = entry_of(&view, 3);
    let at = (0..64)
        .find(|&i| std::ptr::eq(view.entry(i).unwrap(), e))
        .unwrap();
    e.next.store(at, Relaxed);
    assert_eq!(s.index.validate(), Err("chain loops".into()));
}

#[test]
fn an_aborted_slot_is_the_next_one_taken_and_its_neighbours_keep_their_values() {
    let mut s = store(64, 2, PAGE);
    let ns = s.index.namespace(b"m", 64).unwrap();
    // Three slots of one extent, the middle one reserved and given back.
    assert!(put(&mut s, ns, b"x", None));
    let held = s.index.reserve(1, ns.id, &[b"y"], &[]).unwrap()[0].unwrap();
    assert!(put(&mut s, ns, b"z", None));
    assert_ne!(held.offset % (PAGE), 0, "not the extent's first slot");
    assert_eq!(s.index.abort(1, ns.id, &[held]), Ok(1));
    assert!(put(&mut s, ns, b"w", None));
    assert_eq!(
        s.reader.find(ns, b"w").unwrap().data,
        held.offset,
        "the slot given back is the one taken next"
    );
    for k in [b"x", b"z", b"w"] {
        assert_eq!(get(&s, ns, k), Some(value(k, 64)), "{k:?}");
    }
    s.index.validate().unwrap();
}

/// A grace period no reader holds back: every advance moves the epoch,
/// counted in `advances`, and a record is reusable one epoch after it.
struct Unheld {
    epoch: u64,
    advances: std::sync::Arc<std::sync::atomic::AtomicU32>,
}

impl crate::engine::Grace for Unheld {
    fn epoch(&self) -> u64 {
        self.epoch
    }
    fn try_advance(&mut self) -> bool {
        self.advances
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.epoch += 1;
        true
    }
    fn reusable(&self, tag: u64) -> bool {
        tag < self.epoch
    }
}

#[test]
fn reclaim_advances_the_grace_period_only_for_what_waits_and_frees_it_in_one_call() {
    use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
    use std::sync::Arc;
    let advances = Arc::new(AtomicU32::new(0));
    let (mut s, _) = adoptable();
    s.index.set_grace(Box::new(Unheld {
        epoch: 5,
        advances: advances.clone(),
    }));
    assert_eq!(s.index.reclaim(), 0);
    assert_eq!(advances.load(Relaxed), 0, "nothing in limbo: no advance");
    assert!(s.index.evict_one());
    assert_eq!(s.index.in_limbo(), 1);
    assert_eq!(s.index.reclaim(), 1, "one advance, then it is freed");
    assert_eq!(advances.load(Relaxed), 1);
    assert_eq!(s.index.in_limbo(), 0);
    s.index.validate().unwrap();
}

#[test]
fn a_full_store_under_an_unheld_grace_period_evicts_one_value_a_put() {
    use std::sync::atomic::AtomicU32;
    use std::sync::Arc;
    // Eight slots (two 1500-byte values an extent), six taken.
    let (mut s, ns) = adoptable();
    s.index.set_grace(Box::new(Unheld {
        epoch: 0,
        advances: Arc::new(AtomicU32::new(0)),
    }));
    assert!(put(&mut s, ns, &[6], None));
    assert!(put(&mut s, ns, &[7], None));
    // Full: each put evicts one value to limbo, then gets it back from
    // there (the grace period lets go at once) rather than evicting more.
    for (i, k) in (8..12u8).enumerate() {
        assert!(put(&mut s, ns, &[k], None));
        let st = s.reader.stats();
        assert_eq!(
            (st.values, st.bytes, st.evicted),
            (8, 8 * 1500, i as u64 + 1),
            "key {k}"
        );
        s.index.validate().unwrap();
    }
}

/// A grace period a reader holds until `until`.
struct HeldUntil(std::time::Instant);

impl crate::engine::Grace for HeldUntil {
    fn epoch(&self) -> u64 {
        0
    }
    fn try_advance(&mut self) -> bool {
        std::time::Instant::now() >= self.0
    }
    fn reusable(&self, _tag: u64) -> bool {
        std::time::Instant::now() >= self.0
    }
}

#[test]
fn a_reserve_waits_briefly_for_readers_holding_limbo_then_calls_the_store_full() {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    let (mut s, ns) = adoptable();
    assert!(put(&mut s, ns, &[6], None));
    assert!(put(&mut s, ns, &[7], None));
    // A reader that never lets go: everything goes to limbo, and after
    // its brief wait the reserve calls the store full (it does not spin).
    s.index
        .set_grace(Box::new(Held(Arc::new(AtomicBool::new(true)))));
    assert_eq!(
        s.index.reserve(0, ns.id, &[&[8][..]], &[]),
        Err(StoreError::StoreFull { needed: 1 })
    );
    assert_eq!(s.index.in_limbo(), 8);
    s.index.validate().unwrap();
    // A reader that lets go within the wait: the reserve waits it out.
    s.index.set_grace(Box::new(HeldUntil(
        std::time::Instant::now() + std::time::Duration::from_millis(1),
    )));
    assert!(put(&mut s, ns, &[8], None));
    assert_eq!(s.index.in_limbo(), 0);
    s.index.validate().unwrap();
}

#[test]
fn a_reserve_that_runs_out_part_way_names_what_did_not_fit_and_keeps_nothing() {
    let mut s = store(4, 1, PAGE);
    let ns = s.index.namespace(b"m", 64).unwrap();
    let held = s.index.reserve(1, ns.id, &[b"1", b"2", b"3"], &[]).unwrap();
    assert!(held.iter().all(Option::is_some));
    // "a" fits, "b" and "c" do not: two are missing, and "a" is given back.
    assert_eq!(
        s.index.reserve(2, ns.id, &[b"a", b"b", b"c"], &[]),
        Err(StoreError::StoreFull { needed: 2 })
    );
    assert_eq!(s.index.release_client(2), 0, "client 2 holds nothing");
    assert!(
        s.index.reserve(3, ns.id, &[b"a"], &[]).unwrap()[0].is_some(),
        "the room \"a\" had is free again"
    );
    s.index.validate().unwrap();
}

#[test]
fn a_commit_drops_the_link_to_a_parent_gone_since_the_reserve_even_if_its_entry_is_reused() {
    use radixd_ipc::sync::Ordering::Relaxed;
    let mut s = store(8, 1, PAGE);
    let ns = s.index.namespace(b"m", 64).unwrap();
    assert!(put(&mut s, ns, b"p", None));
    let p = s.reader.find(ns, b"p").unwrap();
    let c = s.index.reserve(1, ns.id, &[b"c"], &[Some(b"p")]).unwrap()[0].unwrap();
    let view = *s.index.view();
    let link = || view.entry(c.index).unwrap().parent.load(Relaxed);
    assert_ne!(link(), NIL, "reserved under p");
    // p goes (its child is not committed yet), and a new value q takes its
    // entry: committed, but another generation.
    assert_eq!(s.index.clear(ns.id), Ok(1));
    assert!(put(&mut s, ns, b"q", None));
    let q = s.reader.find(ns, b"q").unwrap();
    assert_eq!(q.index, p.index, "q reuses p's entry");
    assert!(s.index.has_reservations());
    assert_eq!(s.index.commit(1, ns.id, &[c]), Ok(1));
    assert!(!s.index.has_reservations(), "the one reservation committed");
    assert_eq!(link(), NIL, "c's parent is gone: no link, to q or anything");
    // q has no child: it is a leaf, evicted before c.
    assert!(s.index.evict_one());
    assert!(s.reader.exists(ns, b"c") && !s.reader.exists(ns, b"q"));
    s.index.validate().unwrap();
}

#[test]
fn a_key_of_one_namespace_is_not_found_in_another_sharing_its_chain() {
    // Eight buckets: eight namespaces' copies of one key share chains.
    let mut s = store(8, 1, PAGE);
    let names: Vec<StoreNs> = (0..8u8)
        .map(|i| s.index.namespace(&[b'n', i], 64).unwrap())
        .collect();
    for (i, &ns) in names.iter().enumerate() {
        assert!(put(&mut s, ns, b"k", None), "namespace {i}");
        assert!(s.index.contains(ns.id, b"k"));
        for &later in &names[i + 1..] {
            assert!(!s.index.contains(later.id, b"k"));
        }
    }
    s.index.validate().unwrap();
}

#[test]
fn releasing_a_client_or_the_stale_ones_aborts_only_their_reservations() {
    let mut s = store(16, 1, PAGE);
    let ns = s.index.namespace(b"m", 64).unwrap();
    assert!(put(&mut s, ns, b"v", None));
    let one = s.index.reserve(1, ns.id, &[b"a", b"b"], &[]).unwrap();
    let two = s.index.reserve(2, ns.id, &[b"c"], &[]).unwrap();
    let three = s.index.reserve(3, ns.id, &[b"d"], &[]).unwrap();
    assert_eq!(s.index.release_client(1), 2);
    assert_eq!(s.index.release_client(1), 0, "nothing left to client 1");
    assert!(s.index.contains(ns.id, b"v"), "a committed value stays");
    assert_eq!(
        s.index.commit(1, ns.id, &[one[0].unwrap()]),
        Err(StoreError::NotReserved {
            index: one[0].unwrap().index
        })
    );
    // Client 2 is gone, client 3 alive.
    assert_eq!(s.index.release_stale(|owner| owner == 3), 1);
    assert_eq!(s.index.release_stale(|owner| owner == 3), 0);
    assert_eq!(
        s.index.commit(2, ns.id, &[two[0].unwrap()]),
        Err(StoreError::NotReserved {
            index: two[0].unwrap().index
        })
    );
    assert!(s.index.has_reservations());
    assert_eq!(s.index.commit(3, ns.id, &[three[0].unwrap()]), Ok(1));
    assert!(!s.index.has_reservations());
    assert!(s.index.contains(ns.id, b"d") && !s.index.contains(ns.id, b"c"));
    s.index.validate().unwrap();
}

#[test]
fn an_aborted_child_leaves_its_parent_a_parent_of_its_committed_children() {
    let mut s = store(16, 1, PAGE);
    let ns = s.index.namespace(b"m", 64).unwrap();
    assert!(put(&mut s, ns, b"p", None));
    assert!(put(&mut s, ns, b"c1", Some(b"p")));
    let c2 = s.index.reserve(1, ns.id, &[b"c2"], &[Some(b"p")]).unwrap()[0].unwrap();
    assert_eq!(s.index.abort(1, ns.id, &[c2]), Ok(1));
    // p is older, but it still has c1: not a leaf, so c1 goes first.
    assert!(s.index.evict_one());
    assert!(s.reader.exists(ns, b"p") && !s.reader.exists(ns, b"c1"));
    assert!(s.index.evict_one());
    assert!(!s.reader.exists(ns, b"p"));
    assert!(!s.index.evict_one(), "nothing left");
    s.index.validate().unwrap();
}

/// A grace period at the epoch the test sets, which it never advances
/// itself: a record is reusable once the epoch is past its tag.
struct Manual(std::sync::Arc<std::sync::atomic::AtomicU64>);

impl crate::engine::Grace for Manual {
    fn epoch(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
    fn try_advance(&mut self) -> bool {
        false
    }
    fn reusable(&self, tag: u64) -> bool {
        tag < self.epoch()
    }
}

#[test]
fn values_evicted_at_two_epochs_come_back_one_epoch_apart() {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    use std::sync::Arc;
    let epoch = Arc::new(AtomicU64::new(5));
    let (mut s, _) = adoptable();
    s.index.set_grace(Box::new(Manual(epoch.clone())));
    assert!(s.index.evict_one());
    epoch.store(6, Relaxed);
    assert!(s.index.evict_one());
    assert_eq!(s.index.in_limbo(), 2);
    // Epoch 6: what was evicted at 5 is free, what was evicted at 6 not yet.
    assert_eq!(s.index.reclaim(), 1);
    assert_eq!(s.index.in_limbo(), 1);
    epoch.store(7, Relaxed);
    assert_eq!(s.index.reclaim(), 1);
    assert_eq!(s.index.in_limbo(), 0);
    s.index.validate().unwrap();
}

#[test]
fn counters_and_stamps_end_at_the_last_client_and_the_last_entry() {
    let s = store(64, 4, PAGE);
    let v = s.reader.view();
    let l = v.layout();
    let base = v.header() as *const _ as usize;
    let at = |p: usize| (p - base) as u64;
    let last = l.config.clients - 1;
    assert_eq!(
        at(v.counters(last).unwrap() as *const _ as usize),
        l.counters_at + u64::from(last) * std::mem::size_of::<super::layout::Counters>() as u64
    );
    assert!(
        v.counters(l.config.clients).is_none(),
        "past the last client"
    );
    let last = l.config.entries - 1;
    assert_eq!(
        at(v.stamp(last).unwrap() as *const _ as usize),
        l.stamps_at + u64::from(last) * 8
    );
    assert!(v.stamp(l.config.entries).is_none(), "past the last entry");
}

#[test]
fn a_value_lies_at_the_data_offset_the_layout_gives_it() {
    let s = store(64, 4, PAGE);
    let v = s.reader.view();
    let l = v.layout();
    let base = v.header() as *const _ as usize;
    let end = l.config.data_bytes;
    for at in [0, 64, PAGE + 8, end - 8] {
        let p = v.data(at, 8).unwrap() as usize;
        assert_eq!(p.wrapping_sub(base) as u64, l.data_at + at, "offset {at}");
    }
    assert!(v.data(end - 7, 8).is_none(), "past the end");
    assert!(v.data(u64::MAX, 2).is_none(), "wraps");
}
