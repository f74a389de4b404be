//! The engine's record of what it caches and evicts (the hook KV events
//! are built on): exact facts, in order, and nothing when off.

use radixd::engine::{CacheEvent, Config, Engine};

fn engine() -> Engine {
    Engine::new(Config {
        page_size: 2,
        capacity: 8,
    })
    .expect("engine")
}

#[test]
fn off_by_default_records_nothing() {
    let mut e = engine();
    assert!(!e.recording_events());
    let pages = e.alloc(0, 2).expect("alloc");
    e.insert(0, &[1, 2, 3, 4], &pages, false).expect("insert");
    e.evict(4);
    let mut out = Vec::new();
    e.take_events(&mut out);
    assert!(out.is_empty());
}

#[test]
fn stores_splits_page_granular_evictions_and_reset() {
    let mut e = engine();
    e.record_events(true);
    let a = e.alloc(0, 3).expect("alloc");
    e.insert(0, &[1, 2, 3, 4, 5, 6], &a, false).expect("insert");
    // A second key under the first page: the match splits the edge, and
    // the new run hangs under page a[0].
    let b = e.alloc(0, 1).expect("alloc");
    e.insert(0, &[1, 2, 9, 9], &[a[0], b[0]], false)
        .expect("insert");
    let mut out = Vec::new();
    e.take_events(&mut out);
    assert_eq!(
        out,
        vec![
            CacheEvent::Stored {
                parent: None,
                pages: a.clone(),
                tokens: vec![1, 2, 3, 4, 5, 6],
                ns: 0,
            },
            CacheEvent::Stored {
                parent: Some(a[0]),
                pages: b.clone(),
                tokens: vec![9, 9],
                ns: 0,
            },
        ]
    );
    // One page off the least recently used leaf's end: exactly that page.
    out.clear();
    assert_eq!(e.evict(1), 2);
    e.take_events(&mut out);
    assert_eq!(out, vec![CacheEvent::Removed { pages: vec![a[2]] }]);
    // The snapshot a resync sends: parents first (siblings in any order).
    let runs = e.cached_runs();
    assert_eq!(runs.len(), 3);
    assert_eq!(
        runs[0],
        CacheEvent::Stored {
            parent: None,
            pages: vec![a[0]],
            tokens: vec![1, 2],
            ns: 0,
        }
    );
    for child in [
        CacheEvent::Stored {
            parent: Some(a[0]),
            pages: vec![a[1]],
            tokens: vec![3, 4],
            ns: 0,
        },
        CacheEvent::Stored {
            parent: Some(a[0]),
            pages: b.clone(),
            tokens: vec![9, 9],
            ns: 0,
        },
    ] {
        assert!(runs[1..].contains(&child), "{child:?} in {runs:?}");
    }
    out.clear();
    e.reset();
    e.take_events(&mut out);
    assert_eq!(out, vec![CacheEvent::Cleared]);
    assert!(e.cached_runs().is_empty());
}

#[test]
fn recycled_buffers_carry_exactly_the_new_facts() {
    let mut e = engine();
    // Not recording: nothing is kept.
    assert!(!e.recycle_event_buffer(vec![9; 4]));
    e.record_events(true);
    assert!(e.recycle_event_buffer(vec![9, 9, 9, 9, 9, 9, 9, 9]));
    assert!(e.recycle_event_buffer(Vec::with_capacity(2)));
    assert_eq!(e.spare_event_buffers(), 2);
    let a = e.alloc(0, 2).expect("alloc");
    e.insert(0, &[1, 2, 3, 4], &a, false).expect("insert");
    let mut out = Vec::new();
    e.take_events(&mut out);
    assert_eq!(
        out,
        vec![CacheEvent::Stored {
            parent: None,
            pages: a,
            tokens: vec![1, 2, 3, 4],
            ns: 0,
        }]
    );
    assert_eq!(e.spare_event_buffers(), 0);
    // Oversized buffers are not kept.
    assert!(!e.recycle_event_buffer(Vec::with_capacity(radixd::engine::SPARE_BUFFER_LEN + 1)));
}
