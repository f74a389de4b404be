//! The SWA and MAMBA components of the engine: SGLang 0.5.23's
//! `UnifiedRadixCache` rules (tombstones, windows, cascades), seed 000's
//! scan bounds per component, typed errors that change nothing, and a
//! randomized run that checks every invariant after every operation.

mod common;

use common::Rng;
use radixd::engine::{
    Component, ComponentError, Components, Config, Engine, InsertExtra, MambaConfig, PageError,
    SwaConfig,
};

const C: u32 = 1;

fn swa(page_size: u32, capacity: u32, window: u32) -> Engine {
    let comps = Components {
        swa: Some(SwaConfig { window, capacity }),
        mamba: None,
    };
    Engine::with_components(
        Config {
            page_size,
            capacity,
        },
        comps,
    )
    .unwrap()
}

fn mamba(page_size: u32, capacity: u32, states: u32) -> Engine {
    let comps = Components {
        swa: None,
        mamba: Some(MambaConfig { capacity: states }),
    };
    Engine::with_components(
        Config {
            page_size,
            capacity,
        },
        comps,
    )
    .unwrap()
}

fn put(e: &mut Engine, tokens: &[u32]) {
    put_with(e, tokens, InsertExtra::default());
}

fn put_with(e: &mut Engine, tokens: &[u32], extra: InsertExtra) -> bool {
    let p = e.page_size() as usize;
    let pages = e.alloc(C, (tokens.len() / p) as u64).unwrap();
    let (_, ie) = e.insert_with(C, tokens, &pages, false, extra).unwrap();
    e.validate().unwrap();
    ie.mamba_exist
}

fn matched(e: &mut Engine, tokens: &[u32]) -> usize {
    let mut pages = Vec::new();
    let m = e.match_prefix(C, tokens, false, &mut pages);
    assert_eq!(pages.len() * e.page_size() as usize, m.len);
    e.validate().unwrap();
    m.len
}

fn stats(e: &Engine) -> radixd::engine::ComponentStats {
    e.component_stats().unwrap()
}

#[test]
fn a_tombstone_inside_the_window_cuts_the_match_back() {
    // W = 4 tokens: an 8-token leaf is capped at one window, [1..4] above
    // [5..8], both with SWA pages.
    let mut e = swa(1, 32, 4);
    put(&mut e, &[1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(e.stats().nodes, 2);
    assert_eq!(stats(&e).swa_evictable_tokens, 8);
    // The window chain was refreshed leaf first, so the upper node is the
    // least recently used: SWA eviction makes it a tombstone.
    let ev = e.evict_components(0, 4, 0).unwrap();
    assert_eq!((ev.tokens, ev.swa_tokens), (0, 4));
    assert_eq!(stats(&e).swa_evictable_tokens, 4);
    assert_eq!(e.stats().total_tokens, 8, "FULL pages stay");
    // The last 4 tokens still hold SWA pages: the whole prompt matches.
    assert_eq!(matched(&mut e, &[1, 2, 3, 4, 5, 6, 7, 8, 9]), 8);
    // [1..6] ends 2 tokens past the tombstone: too short a window.
    assert_eq!(matched(&mut e, &[1, 2, 3, 4, 5, 6]), 0);
    let mut pages = Vec::new();
    let (m, extra) = e.match_with(C, &[1, 2, 3, 4, 5, 6], false, &mut pages);
    assert_eq!((m.len, extra.full_len), (0, 6));
}

#[test]
fn every_page_says_where_its_swa_page_is() {
    let mut e = swa(1, 8, 2);
    let pages = e.alloc(C, 4).unwrap();
    let paired = e.swa_pages(&pages).unwrap();
    let mut distinct = paired.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), 4, "{paired:?}");
    assert!(paired.iter().all(|&s| s < 8));
    e.free_swa(C, &pages[..1]).unwrap();
    assert_eq!(e.swa_pages(&pages[..1]).unwrap(), [u32::MAX]);
    assert_eq!(
        e.swa_pages(&[8]),
        Err(PageError::OutOfRange {
            page: 8,
            capacity: 8
        })
    );
    let full = common::engine(1, 8);
    assert!(matches!(full.swa_pages(&[0]), Err(PageError::Component(_))));
}

#[test]
fn swa_eviction_takes_whole_leaves_and_tombstones_inner_nodes() {
    let mut e = swa(1, 32, 2);
    put(&mut e, &[1, 2]);
    put(&mut e, &[1, 2, 3, 4]);
    // Chain [1,2] -> [3,4]; refreshed leaf first: [1,2] is older.
    let ev = e.evict_components(0, 2, 0).unwrap();
    assert_eq!((ev.tokens, ev.swa_tokens), (0, 2), "inner node: tombstone");
    assert_eq!(matched(&mut e, &[1, 2]), 0);
    assert_eq!(matched(&mut e, &[1, 2, 3, 4]), 4);
    let ev = e.evict_components(0, 2, 0).unwrap();
    assert_eq!((ev.tokens, ev.swa_tokens), (2, 2), "leaf: gone whole");
    assert_eq!(e.stats().total_tokens, 2);
    assert_eq!(stats(&e).swa_free_pages, 32, "every SWA page free");
}

#[test]
fn full_eviction_frees_swa_pages_and_states_with_its_leaves() {
    let mut e = swa(1, 16, 8);
    put(&mut e, &[1, 2, 3]);
    assert_eq!(stats(&e).swa_free_pages, 13);
    let ev = e.evict_components(3, 0, 0).unwrap();
    assert_eq!((ev.tokens, ev.swa_tokens), (3, 3));
    assert_eq!(stats(&e).swa_free_pages, 16);
    e.validate().unwrap();

    let mut e = mamba(1, 16, 4);
    let s = e.alloc_state(C).unwrap();
    put_with(
        &mut e,
        &[1, 2],
        InsertExtra {
            mamba_state: Some(s),
            swa_evicted: 0,
        },
    );
    assert_eq!(stats(&e).mamba_evictable_states, 1);
    let ev = e.evict_components(1, 0, 0).unwrap();
    assert_eq!(
        (ev.tokens, ev.mamba_states),
        (1, 1),
        "a trimmed node loses its state"
    );
    assert_eq!(stats(&e).mamba_free_states, 4);
    e.validate().unwrap();
}

#[test]
fn an_insert_over_a_tombstone_in_the_window_recovers_its_swa_pages() {
    let mut e = swa(1, 32, 2);
    put(&mut e, &[1, 2]);
    put(&mut e, &[1, 2, 3, 4]);
    e.evict_components(0, 2, 0).unwrap();
    assert_eq!(matched(&mut e, &[1, 2]), 0);
    let free = e.stats().free_pages;
    // Re-inserting [1, 2] with fresh pages gives the tombstone SWA pages
    // again; the fresh FULL pages are duplicates and go back.
    put(&mut e, &[1, 2]);
    assert_eq!(e.stats().free_pages, free);
    assert_eq!(matched(&mut e, &[1, 2]), 2);
    assert_eq!(stats(&e).swa_evictable_tokens, 4);
}

#[test]
fn swa_evicted_leaves_a_tombstone_above_the_window() {
    let mut e = swa(1, 32, 2);
    let tokens = [1, 2, 3, 4, 5, 6];
    let pages = e.alloc(C, 6).unwrap();
    // Decode slid past the first 4 tokens: their SWA pages are freed.
    assert_eq!(e.free_swa(C, &pages[..4]).unwrap(), 4);
    let bad = e.insert_with(C, &tokens, &pages, false, InsertExtra::default());
    assert_eq!(
        bad,
        Err(PageError::SwaPairing {
            page: pages[0],
            paired: false
        })
    );
    let bad = e.insert_with(
        C,
        &tokens,
        &pages,
        false,
        InsertExtra {
            mamba_state: None,
            swa_evicted: 3,
        },
    );
    assert_eq!(
        bad,
        Err(PageError::SwaPairing {
            page: pages[3],
            paired: false
        })
    );
    let extra = InsertExtra {
        mamba_state: None,
        swa_evicted: 4,
    };
    e.insert_with(C, &tokens, &pages, false, extra).unwrap();
    e.validate().unwrap();
    assert_eq!(stats(&e).swa_evictable_tokens, 2);
    assert_eq!(matched(&mut e, &tokens), 6);
    assert_eq!(
        matched(&mut e, &tokens[..5]),
        0,
        "[5] alone is short of the window"
    );
}

#[test]
fn locks_hold_swa_over_the_window_only() {
    let mut e = swa(1, 64, 4);
    for k in 1..=4u32 {
        let key: Vec<u32> = (1..=2 * k).collect();
        put(&mut e, &key);
    }
    // A chain of four 2-token nodes; lock the deepest: SWA over its last 4
    // tokens (two nodes), FULL over all 8.
    let mut pages = Vec::new();
    let m = e.match_prefix(C, &(1..=8).collect::<Vec<_>>(), true, &mut pages);
    assert_eq!(m.len, 8);
    e.validate().unwrap();
    assert_eq!(stats(&e).swa_protected_tokens, 4);
    assert_eq!(e.stats().protected_tokens, 8);
    let ev = e.evict_components(0, 100, 0).unwrap();
    assert_eq!(
        (ev.tokens, ev.swa_tokens),
        (0, 4),
        "only outside the window"
    );
    assert_eq!(matched(&mut e, &(1..=8).collect::<Vec<_>>()), 8);
    e.unlock(C, m.handle.unwrap().to_raw()).unwrap();
    assert_eq!(stats(&e).swa_protected_tokens, 0);
    e.validate().unwrap();
}

#[test]
fn a_mamba_match_ends_at_the_deepest_state() {
    let mut e = mamba(1, 32, 8);
    let s1 = e.alloc_state(C).unwrap();
    put_with(
        &mut e,
        &[1, 2],
        InsertExtra {
            mamba_state: Some(s1),
            swa_evicted: 0,
        },
    );
    // [1..4] cached without a state: FULL only.
    put(&mut e, &[1, 2, 3, 4]);
    let mut pages = Vec::new();
    let (m, x) = e.match_with(C, &[1, 2, 3, 4], false, &mut pages);
    assert_eq!((m.len, x.full_len, x.mamba_state), (2, 4, Some(s1)));
    // A state given where one exists stays the client's, to free.
    let s2 = e.alloc_state(C).unwrap();
    let free = stats(&e).mamba_free_states;
    assert!(put_with(
        &mut e,
        &[1, 2],
        InsertExtra {
            mamba_state: Some(s2),
            swa_evicted: 0
        }
    ));
    assert_eq!(stats(&e).mamba_free_states, free, "it stays the client's");
    e.free_state(C, u64::from(s2)).unwrap();
    assert_eq!(
        e.free_state(C, u64::from(s2)),
        Err(ComponentError::StateNotOwned {
            state: u64::from(s2)
        })
    );
    // MAMBA eviction: [1,2] is inner, so it becomes a tombstone.
    let ev = e.evict_components(0, 0, 1).unwrap();
    assert_eq!((ev.tokens, ev.mamba_states), (0, 1));
    assert_eq!(matched(&mut e, &[1, 2, 3, 4]), 0);
    assert_eq!(e.stats().total_tokens, 4);
}

#[test]
fn a_mamba_leaf_goes_whole_and_a_lock_protects_its_state() {
    let mut e = mamba(1, 32, 2);
    let a = e.alloc_state(C).unwrap();
    let b = e.alloc_state(C).unwrap();
    assert_eq!(e.alloc_state(C), Err(ComponentError::NoFreeState));
    put_with(
        &mut e,
        &[1, 2],
        InsertExtra {
            mamba_state: Some(a),
            swa_evicted: 0,
        },
    );
    put_with(
        &mut e,
        &[5, 6],
        InsertExtra {
            mamba_state: Some(b),
            swa_evicted: 0,
        },
    );
    let mut pages = Vec::new();
    let m = e.match_prefix(C, &[5, 6], true, &mut pages);
    assert_eq!(stats(&e).mamba_protected_states, 1);
    // alloc_state evicts the unlocked one: [1, 2] is a leaf, so it goes.
    let c = e.alloc_state(C).unwrap();
    assert_eq!(c, a);
    assert_eq!(e.stats().total_tokens, 2);
    assert_eq!(e.alloc_state(C), Err(ComponentError::NoFreeState));
    e.unlock(C, m.handle.unwrap().to_raw()).unwrap();
    e.validate().unwrap();
}

#[test]
fn alloc_pairs_swa_pages_and_evicts_swa_when_short() {
    // 16 FULL pages, 6 SWA pages.
    let mut e = swa(1, 16, 8);
    let comps = Components {
        swa: Some(SwaConfig {
            window: 8,
            capacity: 6,
        }),
        mamba: None,
    };
    e.set_components(comps).unwrap();
    let pages = e.alloc(C, 4).unwrap();
    assert_eq!(stats(&e).swa_free_pages, 2);
    e.insert(C, &[1, 2, 3, 4], &pages, false).unwrap();
    // Four more need SWA pages the cache holds: its leaf goes whole.
    let more = e.alloc(C, 4).unwrap();
    assert_eq!(e.stats().total_tokens, 0, "the unlocked leaf went whole");
    assert_eq!(stats(&e).swa_free_pages, 2);
    e.validate().unwrap();
    e.free(C, &more).unwrap();
    assert_eq!(stats(&e).swa_free_pages, 6);
    e.validate().unwrap();
}

#[test]
fn component_requests_the_engine_lacks_change_nothing() {
    let mut e = common::engine(1, 16);
    assert_eq!(
        e.alloc_state(C),
        Err(ComponentError::NotEnabled(Component::Mamba))
    );
    assert_eq!(
        e.evict_components(0, 4, 0),
        Err(ComponentError::NotEnabled(Component::Swa))
    );
    let pages = e.alloc(C, 2).unwrap();
    assert_eq!(
        e.free_swa(C, &pages),
        Err(PageError::Component(ComponentError::NotEnabled(
            Component::Swa
        )))
    );
    let extra = InsertExtra {
        mamba_state: Some(0),
        swa_evicted: 0,
    };
    let before = e.stats();
    assert!(matches!(
        e.insert_with(C, &[1, 2], &pages, false, extra),
        Err(PageError::Component(_))
    ));
    assert_eq!(e.stats(), before);

    let mut e = mamba(1, 16, 2);
    let pages = e.alloc(C, 2).unwrap();
    let extra = InsertExtra {
        mamba_state: Some(1),
        swa_evicted: 0,
    };
    let err = e.insert_with(C, &[1, 2], &pages, false, extra);
    assert_eq!(
        err,
        Err(PageError::Component(ComponentError::StateNotOwned {
            state: 1
        }))
    );
    assert_eq!(e.stats().total_tokens, 0);
    assert_eq!(
        e.free_state(7, 0),
        Err(ComponentError::StateNotOwned { state: 0 })
    );
    assert_eq!(
        e.free_state(C, 99),
        Err(ComponentError::StateNotOwned { state: 99 })
    );

    let mut e = swa(4, 16, 8);
    let pages = e.alloc(C, 2).unwrap();
    let extra = InsertExtra {
        mamba_state: None,
        swa_evicted: 3,
    };
    let err = e.insert_with(C, &[1; 8], &pages, false, extra);
    assert_eq!(err, Err(PageError::SwaEvicted { tokens: 3, len: 8 }));
    assert_eq!(
        e.free_swa(9, &pages),
        Err(PageError::NotOwned { page: pages[0] })
    );
    assert_eq!(stats(&e).swa_free_pages, 14);
    e.validate().unwrap();
}

/// Seed 000, proposal 1: K locked nodes interleaved with M victims cost
/// M + K visits, not M * K.
#[test]
fn skips_are_visited_once_per_eviction() {
    for (m_victims, k_skips) in [(50u32, 50u32), (200, 10), (10, 200)] {
        let n = m_victims + k_skips;
        let mut e = swa(1, 4 * n, 1);
        let mut locks = Vec::new();
        // Oldest first: a skip every (n / k) keys.
        for i in 0..n {
            let key = [i + 1];
            put(&mut e, &key);
            if (i as u64 * u64::from(k_skips)) / u64::from(n)
                != ((i as u64 + 1) * u64::from(k_skips)) / u64::from(n)
            {
                let mut pages = Vec::new();
                locks.push(e.match_prefix(C, &key, true, &mut pages).handle.unwrap());
            }
        }
        assert_eq!(locks.len() as u32, k_skips);
        let before = stats(&e).evict_scanned_swa;
        let ev = e.evict_components(0, u64::from(m_victims), 0).unwrap();
        assert_eq!(ev.swa_tokens, u64::from(m_victims));
        let scanned = stats(&e).evict_scanned_swa - before;
        assert!(
            scanned <= u64::from(n),
            "{scanned} visits for M={m_victims} K={k_skips}"
        );
        assert!(scanned >= u64::from(m_victims));
        e.validate().unwrap();
    }
}

/// Seed 000, proposal 2's case: N touched chains of depth D evicted whole
/// cost N * D visits, for SWA and MAMBA alike.
#[test]
fn touched_chains_cost_one_visit_per_node() {
    let (n, d) = (20u32, 8u32);
    let mut s = swa(1, n * d * 2, d + 1);
    let mut m = mamba(1, n * d * 2, n * d + 1);
    for c in 0..n {
        for depth in 1..=d {
            let key: Vec<u32> = std::iter::once(1000 + c).chain(1..depth).collect();
            put(&mut s, &key);
            let st = m.alloc_state(C).unwrap();
            put_with(
                &mut m,
                &key,
                InsertExtra {
                    mamba_state: Some(st),
                    swa_evicted: 0,
                },
            );
        }
        // Touch the chain.
        let key: Vec<u32> = std::iter::once(1000 + c).chain(1..d).collect();
        assert_eq!(matched(&mut s, &key), d as usize);
        assert_eq!(matched(&mut m, &key), d as usize);
    }
    let ev = s.evict_components(0, u64::from(n * d), 0).unwrap();
    assert_eq!(ev.swa_tokens, u64::from(n * d));
    assert_eq!(stats(&s).evict_scanned_swa, u64::from(n * d));
    let ev = m.evict_components(0, 0, u64::from(n * d)).unwrap();
    assert_eq!(ev.mamba_states, u64::from(n * d));
    assert_eq!(stats(&m).evict_scanned_mamba, u64::from(n * d));
    s.validate().unwrap();
    m.validate().unwrap();
}

/// Random operations on hybrid engines, every invariant checked after
/// each; and FULL+SWA with a window longer than any key and an SWA pool
/// as large as FULL's answers exactly as FULL alone.
#[test]
fn random_operations_keep_every_invariant() {
    for seed in 1..=6u64 {
        let mut rng = Rng(seed * 7919);
        let p = [1u32, 4][seed as usize % 2];
        let cap = 48;
        let mut full = common::engine(p, cap);
        let mut wide = swa(p, cap, 64 * p);
        let mut narrow = swa(p, cap, 2 * p);
        let comps = Components {
            swa: Some(SwaConfig {
                window: 2 * p,
                capacity: cap / 2,
            }),
            mamba: None,
        };
        narrow.set_components(comps).unwrap();
        let mut mam = mamba(p, cap, 6);
        let mut locks: Vec<Vec<u64>> = vec![Vec::new(); 4];
        for step in 0..1500 {
            let len = (1 + rng.below(6)) as usize * p as usize;
            let key: Vec<u32> = (0..len)
                .map(|i| (rng.below(3) as u32) * 10 + i as u32 % 3)
                .collect();
            let op = rng.below(10);
            let (coin, lock, amount) = (rng.below(2) == 0, rng.below(3) == 0, 1 + rng.below(8));
            let engines: [&mut Engine; 4] = [&mut full, &mut wide, &mut narrow, &mut mam];
            let mut answers = Vec::new();
            for (k, e) in engines.into_iter().enumerate() {
                let a = match op {
                    0..=3 => {
                        let n = (len / p as usize) as u64;
                        match e.alloc(C, n) {
                            Ok(pages) => {
                                let state = if k == 3 && coin {
                                    e.alloc_state(C).ok()
                                } else {
                                    None
                                };
                                let extra = InsertExtra {
                                    mamba_state: state,
                                    swa_evicted: 0,
                                };
                                let r = e
                                    .insert_with(C, &key, &pages, false, extra)
                                    .map(|(i, _)| i.cached);
                                if r.is_err() {
                                    e.free(C, &pages).unwrap();
                                }
                                format!("{r:?}")
                            }
                            Err(err) => format!("{err:?}"),
                        }
                    }
                    4..=5 => {
                        let mut pages = Vec::new();
                        // The lock-free read predicts the match exactly.
                        let mut read = Vec::new();
                        let usable = e.peek_usable(&key, &mut read).unwrap();
                        let (m, x) = e.match_with(C, &key, lock, &mut pages);
                        assert_eq!(
                            (usable.len, usable.mamba_state),
                            (m.len, x.mamba_state),
                            "seed {seed} step {step} engine {k}"
                        );
                        assert_eq!(read, pages);
                        if let (true, Some(h)) = (lock, m.handle) {
                            locks[k].push(h.to_raw());
                        }
                        format!("{} {:?}", m.len, pages)
                    }
                    6 => match locks[k].pop() {
                        Some(h) => format!("{:?}", e.unlock(C, h)),
                        None => String::new(),
                    },
                    7 => format!(
                        "{:?}",
                        e.evict_components(amount * u64::from(p), 0, 0)
                            .map(|x| x.tokens)
                    ),
                    8 => {
                        if k == 2 {
                            e.evict_components(0, amount * u64::from(p), 0).unwrap();
                        }
                        if k == 3 {
                            e.evict_components(0, 0, amount / 3).unwrap();
                        }
                        String::new()
                    }
                    _ => format!("{:?}", e.evict(u64::from(p))),
                };
                e.validate().unwrap_or_else(|err| {
                    panic!("seed {seed} step {step} engine {k} op {op}: {err}")
                });
                answers.push(a);
            }
            assert_eq!(
                answers[0], answers[1],
                "seed {seed} step {step}: FULL+SWA without pressure differs"
            );
            let (f, w) = (full.stats(), wide.stats());
            assert_eq!(
                (
                    f.total_tokens,
                    f.evictable_tokens,
                    f.protected_tokens,
                    f.free_pages
                ),
                (
                    w.total_tokens,
                    w.evictable_tokens,
                    w.protected_tokens,
                    w.free_pages
                )
            );
        }
    }
}

#[test]
fn sessions_and_dead_clients_hold_and_release_components() {
    let mut e = swa(1, 32, 2);
    let pages = e.alloc(C, 6).unwrap();
    e.session_commit(C, "s", &[1, 2, 3, 4, 5, 6], &pages)
        .unwrap();
    e.validate().unwrap();
    // The session's lock holds the window: two SWA tokens protected.
    assert_eq!(stats(&e).swa_protected_tokens, 2);
    e.release_client(C);
    e.validate().unwrap();
    assert_eq!(stats(&e).swa_protected_tokens, 0);

    let mut e = mamba(1, 32, 4);
    let a = e.alloc_state(C).unwrap();
    let _b = e.alloc_state(C).unwrap();
    put_with(
        &mut e,
        &[1, 2],
        InsertExtra {
            mamba_state: Some(a),
            swa_evicted: 0,
        },
    );
    let mut pages = Vec::new();
    e.match_prefix(C, &[1, 2], true, &mut pages);
    assert_eq!(stats(&e).mamba_protected_states, 1);
    e.release_client(C);
    e.validate().unwrap();
    // The client's own slot came back; the cached one stays cached.
    assert_eq!(stats(&e).mamba_free_states, 3);
    assert_eq!(stats(&e).mamba_evictable_states, 1);
}

/// Routers index FULL blocks: an SWA tombstone publishes nothing, a leaf
/// SWA eviction takes whole publishes its pages' removal.
#[test]
fn secondary_evictions_publish_only_what_full_loses() {
    use radixd::engine::CacheEvent;
    let mut e = swa(1, 32, 2);
    e.record_events(true);
    put(&mut e, &[1, 2]);
    put(&mut e, &[1, 2, 3, 4]);
    let mut events = Vec::new();
    e.take_events(&mut events);
    assert_eq!(events.len(), 2, "{events:?}");
    events.clear();
    // [1, 2] is inner: a tombstone, nothing published.
    e.evict_components(0, 2, 0).unwrap();
    e.take_events(&mut events);
    assert!(events.is_empty(), "{events:?}");
    // [3, 4] is a leaf: gone whole, both pages removed.
    e.evict_components(0, 2, 0).unwrap();
    e.take_events(&mut events);
    assert!(
        matches!(&events[..], [CacheEvent::Removed { pages }] if pages.len() == 2),
        "{events:?}"
    );
}

/// The lock-free read counts the window in tokens at any page size: past
/// a tombstone, two 4-token pages fill an 8-token window.
#[test]
fn the_read_counts_the_window_in_tokens() {
    let mut e = swa(4, 32, 8);
    let key: Vec<u32> = (1..=16).collect();
    put(&mut e, &key);
    // Capped at one window: [1..8] above [9..16]; the upper one goes.
    assert_eq!(e.evict_components(0, 8, 0).unwrap().swa_tokens, 8);
    let mut read = Vec::new();
    let usable = e.peek_usable(&key, &mut read).unwrap();
    assert_eq!((usable.len, read.len()), (16, 4));
    assert_eq!(matched(&mut e, &key), 16);
    // Inside the tail: a split there keeps 4 tokens, short of the window.
    let usable = e.peek_usable(&key[..12], &mut read).unwrap();
    assert_eq!(usable.len, 0);
    assert_eq!(matched(&mut e, &key[..12]), 0);
}

/// ... and so does the read of a match that would end inside a node (the
/// engine splits it there): here the cut page completes the window.
#[test]
fn the_read_of_a_cut_node_counts_its_tokens() {
    let mut e = swa(4, 32, 12);
    let key: Vec<u32> = (1..=24).collect();
    for end in [8, 16, 24] {
        put(&mut e, &key[..end]);
    }
    // [1..8] (least recently used) becomes a tombstone; [9..16] alone is
    // short of the 12-token window, one page of [17..24] completes it.
    assert_eq!(e.evict_components(0, 8, 0).unwrap().swa_tokens, 8);
    let mut read = Vec::new();
    let usable = e.peek_usable(&key[..20], &mut read).unwrap();
    assert_eq!((usable.len, read.len()), (20, 5));
    assert_eq!(matched(&mut e, &key[..20]), 20);
}

/// A read cut back by MAMBA keeps only the usable prefix's pages.
#[test]
fn a_read_cut_back_keeps_the_usable_pages() {
    let mut e = mamba(4, 32, 4);
    let key: Vec<u32> = (1..=16).collect();
    let s = e.alloc_state(C).unwrap();
    put_with(
        &mut e,
        &key[..8],
        InsertExtra {
            mamba_state: Some(s),
            swa_evicted: 0,
        },
    );
    put(&mut e, &key);
    let mut read = Vec::new();
    let usable = e.peek_usable(&key, &mut read).unwrap();
    assert_eq!(
        (usable.len, read.len(), usable.mamba_state),
        (8, 2, Some(s))
    );
}

/// The scenario of issue 29: two locks on one node, a split between them,
/// released oldest first and newest first. Each release gives back exactly
/// the window its lock took (SGLang's `dec_lock_ref` with its receipt).
#[test]
fn each_lock_releases_the_window_it_took_in_any_order() {
    for oldest_first in [true, false] {
        // FULL+SWA, page size 4, window 10 tokens.
        let mut e = swa(4, 64, 10);
        let t: Vec<u32> = (1000..1068).collect();
        put(&mut e, &t);
        let sizes = |e: &Engine| {
            let s = stats(e);
            (s.swa_protected_tokens, s.swa_evictable_tokens)
        };
        let mut pages = Vec::new();
        let one = e.match_prefix(C, &t[..50], true, &mut pages);
        assert_eq!(one.len, 48);
        // Splits the locked node at 12: the lock held 48 tokens, still does.
        assert_eq!(matched(&mut e, &t[..15]), 12);
        assert_eq!(sizes(&e), (48, 20));
        let two = e.match_prefix(C, &t[..50], true, &mut pages);
        assert_eq!(two.len, 48);
        // The same node, two locks: each handle names its own.
        let (one, two) = (one.handle.unwrap(), two.handle.unwrap());
        assert_eq!(one.node(), two.node());
        assert_ne!(one, two);
        e.validate().unwrap();
        if oldest_first {
            // Lock 1 took both halves (48 tokens); lock 2 the lower one (36).
            e.unlock(C, one.to_raw()).unwrap();
            assert_eq!(sizes(&e), (36, 32));
        } else {
            e.unlock(C, two.to_raw()).unwrap();
            assert_eq!(sizes(&e), (48, 20));
        }
        e.validate().unwrap();
        let last = if oldest_first { two } else { one };
        e.unlock(C, last.to_raw()).unwrap();
        assert_eq!(sizes(&e), (0, 68));
        e.validate().unwrap();
        // Released, a lock's handle still names its node, for `lock`; it
        // holds no lock of its own any more.
        assert_eq!(
            e.unlock(C, one.to_raw()),
            Err(radixd::engine::HandleError::NotLocked(one.to_raw()))
        );
        e.lock(C, one.to_raw()).unwrap();
        assert_eq!(sizes(&e), (36, 32));
        e.unlock(C, one.to_raw()).unwrap();
        assert_eq!(sizes(&e), (0, 68));
        e.validate().unwrap();
    }
}

/// `lock` of a node's handle (SGLang's `inc_lock_ref` after a match) answers
/// the handle of the lock it took, so locks taken that way release exactly
/// their own windows too: issue 29's scenario, newest first.
#[test]
fn lock_answers_the_handle_of_the_lock_it_took() {
    let mut e = swa(4, 64, 10);
    let t: Vec<u32> = (1000..1068).collect();
    put(&mut e, &t);
    let sizes = |e: &Engine| {
        let s = stats(e);
        (s.swa_protected_tokens, s.swa_evictable_tokens)
    };
    let mut pages = Vec::new();
    let node = e
        .match_prefix(C, &t[..50], false, &mut pages)
        .handle
        .unwrap();
    let one = e.lock(C, node.to_raw()).unwrap();
    assert!(one.is_lock() && one.node() == node.index);
    assert_eq!(matched(&mut e, &t[..15]), 12);
    let two = e.lock(C, node.to_raw()).unwrap();
    assert_ne!(one, two);
    assert_eq!(sizes(&e), (48, 20));
    e.unlock(C, two.to_raw()).unwrap();
    assert_eq!(sizes(&e), (48, 20));
    e.unlock(C, one.to_raw()).unwrap();
    assert_eq!(sizes(&e), (0, 68));
    e.validate().unwrap();
    // Without SWA a lock is its node's: `lock` answers the node's handle.
    let mut m = Engine::with_components(
        Config {
            page_size: 4,
            capacity: 64,
        },
        Components {
            swa: None,
            mamba: None,
        },
    )
    .unwrap();
    put(&mut m, &t[..8]);
    let h = m
        .match_prefix(C, &t[..8], false, &mut pages)
        .handle
        .unwrap();
    assert_eq!(m.lock(C, h.to_raw()), Ok(h));
    m.unlock(C, h.to_raw()).unwrap();
    m.validate().unwrap();
}

/// A lock's handle is checked as a node's is: one from before the node's
/// slot was reused is stale, one never handed out unknown; a node's handle
/// drops the oldest lock its client holds there.
#[test]
fn lock_handles_name_their_node_while_it_lives() {
    let mut e = swa(4, 8, 8);
    let t: Vec<u32> = (1..=8).collect();
    put(&mut e, &t);
    let mut pages = Vec::new();
    let m = e.match_prefix(C, &t, true, &mut pages);
    let h = m.handle.unwrap();
    assert!(h.is_lock());
    // A serial the node never gave out.
    let ahead = radixd::engine::Handle {
        generation: h.generation + 1,
        ..h
    };
    assert_eq!(
        e.lock(C, ahead.to_raw()),
        Err(radixd::engine::HandleError::Stale(ahead.to_raw()))
    );
    let nowhere = radixd::engine::Handle {
        index: radixd::engine::Handle::LOCK | 1_000_000,
        generation: 1,
    };
    assert_eq!(
        e.unlock(C, nowhere.to_raw()),
        Err(radixd::engine::HandleError::Unknown(nowhere.to_raw()))
    );
    // Another client cannot release it.
    assert_eq!(
        e.unlock(C + 1, h.to_raw()),
        Err(radixd::engine::HandleError::NotLocked(h.to_raw()))
    );
    // A node's handle (a match without lock) drops the oldest lock.
    let plain = e.match_prefix(C, &t, false, &mut pages).handle.unwrap();
    assert!(!plain.is_lock());
    e.unlock(C, plain.to_raw()).unwrap();
    assert_eq!(stats(&e).swa_protected_tokens, 0);
    e.validate().unwrap();
    // Evicted, its node's slot reused: the lock's handle is stale.
    e.evict(64);
    put(&mut e, &(50..58).collect::<Vec<_>>());
    assert_eq!(
        e.lock(C, h.to_raw()),
        Err(radixd::engine::HandleError::Stale(h.to_raw()))
    );
    e.validate().unwrap();
}

/// Random matches, splits and locks, then every lock released in arrival,
/// reverse or random order: after each release the SWA sizes are those of
/// the same operations with the released locks never taken (with no
/// eviction, a lock changes nothing but lock counts).
#[test]
fn released_locks_leave_no_trace_in_any_order() {
    #[derive(Clone, Copy)]
    enum Op {
        Put(u64),
        Match(u64, usize),
        Lock(u64, usize),
    }
    fn key(seed: u64, len: usize) -> Vec<u32> {
        (0..len)
            .map(|i| (seed as u32 % 3) * 100 + i as u32 % 7)
            .collect()
    }
    fn apply(ops: &[Op], skip: &[usize]) -> (Engine, Vec<u64>) {
        let mut e = swa(2, 256, 5);
        let mut handles = Vec::new();
        let mut pages = Vec::new();
        for (i, &op) in ops.iter().enumerate() {
            match op {
                Op::Put(s) => {
                    let k = key(s, 2 * (1 + s as usize % 9));
                    let m = e.match_prefix(C, &k, true, &mut pages);
                    let fresh = e.alloc(C, ((k.len() - m.len) / 2) as u64).unwrap();
                    pages.extend(fresh);
                    e.insert(C, &k, &pages, false).unwrap();
                    if let Some(h) = m.handle {
                        e.unlock(C, h.to_raw()).unwrap();
                    }
                }
                Op::Match(s, len) => {
                    e.match_prefix(C, &key(s, len), false, &mut pages);
                }
                Op::Lock(s, len) if !skip.contains(&i) => {
                    let m = e.match_prefix(C, &key(s, len), true, &mut pages);
                    handles.extend(m.handle.map(|h| h.to_raw()));
                }
                Op::Lock(s, len) => {
                    e.match_prefix(C, &key(s, len), false, &mut pages);
                }
            }
        }
        (e, handles)
    }
    let mut rng = Rng(29);
    for round in 0..12 {
        let ops: Vec<Op> = (0..40)
            .map(|_| {
                let (s, len) = (rng.below(6), 1 + rng.below(20) as usize);
                match rng.below(3) {
                    0 => Op::Put(s),
                    1 => Op::Match(s, len),
                    _ => Op::Lock(s, len),
                }
            })
            .collect();
        let lock_ops: Vec<usize> = (0..ops.len())
            .filter(|&i| {
                matches!(ops[i], Op::Lock(..)) && {
                    // Locks that matched something have handles.
                    let (e, h) = apply(&ops[..=i], &[]);
                    drop(e);
                    let (_, before) = apply(&ops[..i], &[]);
                    h.len() > before.len()
                }
            })
            .collect();
        let (mut e, handles) = apply(&ops, &[]);
        assert_eq!(handles.len(), lock_ops.len());
        let mut order: Vec<usize> = (0..handles.len()).collect();
        match round % 3 {
            0 => {}
            1 => order.reverse(),
            _ => {
                for i in (1..order.len()).rev() {
                    order.swap(i, rng.below(i as u64 + 1) as usize);
                }
            }
        }
        let mut released = Vec::new();
        for k in order {
            e.unlock(C, handles[k]).unwrap();
            e.validate().unwrap();
            released.push(lock_ops[k]);
            let (twin, _) = apply(&ops, &released);
            assert_eq!(
                stats(&e),
                stats(&twin),
                "round {round}: after releasing {released:?}"
            );
        }
        assert_eq!(stats(&e).swa_protected_tokens, 0);
    }
}
