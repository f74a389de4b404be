//! The store's lock-free get (`radixd::store::StoreReader::get_raw`, the
//! code that ships: `find`, then `copy_found`'s copy through
//! `StoreView::copy_out` and its version re-check) racing the store's real
//! writer (`StoreIndex::reserve`, which evicts the value the reader found
//! and reuses its entry and data slot, the client's copy into the slot
//! through `StoreView::copy_in`, `StoreIndex::commit`), over a
//! `LoomStore`: the store's records, and its data region as words, in loom
//! atomics. (Data in plain memory would reach the reader at once and in
//! order while the version's loads may still be stale: a model built that
//! way fails even with the re-check, for want of the happens-before a
//! racing read of the writer's bytes gives on real hardware.)
//!
//! - `a_get_never_returns_another_keys_bytes`: a store of one entry holds
//!   "o". The writer puts "n": "o" is evicted (no grace period here: the
//!   versions alone must keep the reader right), its entry and slot are
//!   reused, "n"'s bytes are copied in and committed. A get of "o" must
//!   return "o"'s bytes or a miss, never "n"'s.
//! - `a_copy_is_kept_only_under_an_unchanged_version`: the same race with
//!   the reader's `find` done before the writer starts, so only the copy
//!   and its re-check (`copy_found`) race the writer: every interleaving of
//!   the copy with the eviction, reuse, copy-in and commit.
//! - `the_loom_store_keeps_what_the_store_keeps`: one thread, no race: the
//!   `LoomStore`'s clock, counters, use stamps and data words hold what
//!   the store's code puts there (at an unaligned offset too), so the
//!   models above run on a store that keeps them, not on stand-ins.
//!
//! On the path: the executions whose get began before the writer's first
//! change and ended after its last (stage witnesses, SeqCst, outside the
//! protocol). Mutation tried (by hand, then reverted; docs/modelcheck.md):
//! `copy_found` without its `version.still` re-check fails the model.
#![cfg(loom)]

use loom_tests::{explore, explore_bounded};
use radixd::store::layout::PAGE;
use radixd::store::{LoomStore, StoreConfig, StoreIndex, StoreNs, StoreReader};

/// A store of one entry and one 4 KiB extent, formatted, holding "o" in
/// namespace "m" (boxed: its views point at it).
fn store_with_o() -> (Box<LoomStore>, StoreIndex, StoreNs) {
    let store = Box::new(
        LoomStore::new(StoreConfig {
            data_bytes: PAGE,
            extent_bytes: PAGE,
            entries: 1,
            clients: 1,
        })
        .expect("config"),
    );
    let mut index = StoreIndex::format(store.view());
    let ns = index.namespace(b"m", SIZE as u64).expect("namespace");
    put(&mut index, ns, b"o");
    (store, index, ns)
}
use radixd_ipc::sync::{Arc, AtomicU32, Ordering};

/// One data word: each relaxed load of a copy multiplies the executions.
const SIZE: usize = 8;

/// The bytes of `key`'s value: every byte tells the key apart.
fn value(key: &[u8]) -> [u8; SIZE] {
    let mut v = [0u8; SIZE];
    for (i, b) in v.iter_mut().enumerate() {
        *b = key[0] ^ (i as u8);
    }
    v
}

/// Stores `key` as a client does: reserve, copy into the slot, commit.
fn put(index: &mut StoreIndex, ns: StoreNs, key: &[u8]) {
    let slot = index.reserve(1, ns.id, &[key], &[]).expect("reserve")[0].expect("a slot");
    let v = value(key);
    // SAFETY: the slot is reserved for this writer; `v` is a live buffer
    // of its length.
    assert!(unsafe { index.view().copy_in(slot.offset, v.as_ptr(), SIZE) });
    assert_eq!(index.commit(1, ns.id, &[slot]), Ok(1));
}

/// A get of `key`: its bytes, or `None` for a miss.
fn get(reader: &StoreReader, ns: StoreNs, key: &[u8], stamp: u64) -> Option<[u8; SIZE]> {
    let mut out = [0u8; SIZE];
    let pieces = [(out.as_mut_ptr(), SIZE)];
    // SAFETY: `out` is a live buffer of the pieces' length.
    let hit = unsafe { reader.get_raw(ns, key, &pieces, stamp) };
    hit.then_some(out)
}

/// At most one preemption: the race needs one (the reader stopped between
/// its find and its copy, or inside either; the writer then runs to its
/// end), and every relaxed load still reads any store loom allows.
#[test]
fn a_get_never_returns_another_keys_bytes() {
    explore_bounded(
        "a_get_never_returns_another_keys_bytes",
        10_000,
        Some(1),
        || {
            let (store, mut index, ns) = store_with_o();
            let reader = StoreReader::new(store.view(), 0);
            let stage = Arc::new(AtomicU32::new(0));
            let writer = {
                let stage = stage.clone();
                loom::thread::spawn(move || {
                    put(&mut index, ns, b"n");
                    // SeqCst: a witness outside the protocol.
                    stage.store(1, Ordering::SeqCst);
                    index
                })
            };
            // SeqCst, both: witnesses.
            let before = stage.load(Ordering::SeqCst);
            let got = get(&reader, ns, b"o", 1);
            let after = stage.load(Ordering::SeqCst);
            if let Some(bytes) = got {
                assert!(bytes == value(b"o"), "\"o\" answered with other bytes");
            }
            let index = writer.join().expect("writer");
            assert_eq!(get(&reader, ns, b"o", 2), None, "evicted");
            assert_eq!(get(&reader, ns, b"n", 3), Some(value(b"n")));
            assert_eq!(index.figures().evicted, 1);
            drop(index);
            drop(store);
            before == 0 && after == 1
        },
    );
}

/// Any number of preemptions (the default bound): the reader's part is one
/// copy and one re-check.
#[test]
fn a_copy_is_kept_only_under_an_unchanged_version() {
    explore_bounded(
        "a_copy_is_kept_only_under_an_unchanged_version",
        40,
        None,
        || {
            let (store, mut index, ns) = store_with_o();
            let reader = StoreReader::new(store.view(), 0);
            let found = reader.find(ns, b"o").expect("o is stored");
            let stage = Arc::new(AtomicU32::new(0));
            let writer = {
                let stage = stage.clone();
                loom::thread::spawn(move || {
                    put(&mut index, ns, b"n");
                    // SeqCst: a witness outside the protocol.
                    stage.store(1, Ordering::SeqCst);
                    index
                })
            };
            let mut out = [0u8; SIZE];
            let pieces = [(out.as_mut_ptr(), SIZE)];
            // SeqCst, both: witnesses.
            let before = stage.load(Ordering::SeqCst);
            // SAFETY: `out` is a live buffer of the pieces' length.
            let kept = unsafe { reader.copy_found(ns, found, &pieces, 1) };
            let after = stage.load(Ordering::SeqCst);
            if kept {
                assert!(out == value(b"o"), "a copy of \"o\" kept with other bytes");
            }
            let index = writer.join().expect("writer");
            assert_eq!(index.figures().evicted, 1);
            drop(index);
            drop(store);
            before == 0 && after == 1
        },
    );
}

/// One execution: the loom store's accessors, which only the models use
/// (`cargo mutants` found the models blind to a fresh clock, no counters
/// or stamps, and data words counted from the wrong end).
#[test]
fn the_loom_store_keeps_what_the_store_keeps() {
    explore("the_loom_store_keeps_what_the_store_keeps", 1, || {
        let (store, index, ns) = store_with_o();
        let reader = StoreReader::new(store.view(), 0);
        let first = reader.stamps(3);
        assert_eq!(reader.stamps(1), first + 3, "one clock");
        assert_eq!(get(&reader, ns, b"o", first + 2), Some(value(b"o")));
        let view = store.view();
        let stamp = view.stamp(0).expect("entry 0's stamp");
        assert_eq!(stamp.load(Ordering::Relaxed), first + 2, "the get's stamp");
        reader.count(2, 1);
        let stats = reader.stats();
        assert_eq!((stats.client_hits, stats.client_misses), (2, 1));
        // Values of their own (nothing reads "o" after this): one a few
        // words on, one starting inside a word (word 1, byte 4 of it).
        for at in [24u64, 12] {
            let v = value(&[at as u8]);
            let mut out = [0u8; SIZE];
            // SAFETY: one thread, nothing else reads or writes these
            // bytes; `v` and `out` are live buffers of `SIZE` bytes.
            unsafe {
                assert!(view.copy_in(at, v.as_ptr(), SIZE));
                assert!(view.copy_out(at, out.as_mut_ptr(), SIZE));
            }
            assert_eq!(out, v, "at {at}");
        }
        drop(index);
        true
    });
}
