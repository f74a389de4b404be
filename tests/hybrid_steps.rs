//! The hybrid step's requests (`AllocPaired`, `LockPaired`,
//! `InsertPaired`, `AllocStates`, `FreeStates`, counted requests): each
//! answers what the separate requests answer in a row, in process and
//! through a daemon; bad input is refused with a typed error and changes
//! nothing; and a client's kept free counts (`Client::free_counts`) are
//! the daemon's, whoever changed them, without a round trip while they
//! hold.

mod common;

use common::Daemon;
use radixd::engine::{
    ComponentStats, Components, Config, Engine, FreeCounts, InsertExtra, MambaConfig, Stats,
    SwaConfig,
};
use radixd::op::{apply, ErrorKind, Rejection, Reply, Request};
use radixd::{Client, ClientError};

const ME: u32 = 1;

fn swa_components() -> Components {
    Components {
        swa: Some(SwaConfig {
            window: 4,
            capacity: 24,
        }),
        mamba: None,
    }
}

fn mamba_components() -> Components {
    Components {
        swa: None,
        mamba: Some(MambaConfig { capacity: 4 }),
    }
}

fn engine(components: Components) -> Engine {
    let config = Config {
        page_size: 2,
        capacity: 24,
    };
    Engine::with_components(config, components).unwrap()
}

fn run(e: &mut Engine, r: Request) -> Result<Reply, Rejection> {
    apply(e, ME, r)
}

fn ok(e: &mut Engine, r: Request) -> Reply {
    let shown = format!("{r:?}");
    run(e, r).unwrap_or_else(|err| panic!("{shown}: {err:?}"))
}

fn counted(r: Request) -> Request {
    Request::Counted(Box::new(r))
}

/// Everything an answer could have changed, to compare twins and a call
/// refused with what was there before it.
fn state(e: &Engine) -> (Stats, Option<ComponentStats>, FreeCounts) {
    e.validate().expect("invariants hold");
    (e.stats(), e.component_stats(), e.free_counts())
}

/// The free counts `StatsWith` says.
fn counts_of(e: &mut Engine) -> FreeCounts {
    match ok(e, Request::StatsWith) {
        Reply::StatsWith {
            stats, components, ..
        } => {
            let c = components.unwrap_or_default();
            FreeCounts {
                pages: stats.free_pages,
                swa_pages: c.swa_free_pages,
                mamba_states: c.mamba_free_states,
            }
        }
        other => panic!("{other:?}"),
    }
}

/// `stats`, `lock`, `stats`, `swa_pages` in a row, as `LockPaired`
/// answers them.
fn lock_apart(e: &mut Engine, handle: u64, pages: &[u32]) -> Reply {
    let protected = |e: &mut Engine| match ok(e, Request::Stats) {
        Reply::Stats { stats, .. } => stats.protected_tokens as i64,
        other => panic!("{other:?}"),
    };
    let before = protected(e);
    let lock = match ok(e, Request::Lock { handle }) {
        Reply::Locked(lock) => lock,
        Reply::Done => handle,
        other => panic!("{other:?}"),
    };
    let delta = before - protected(e);
    let swa_pages = match pages.is_empty() {
        true => Vec::new(),
        false => match ok(
            e,
            Request::SwaPages {
                pages: pages.to_vec(),
            },
        ) {
            Reply::SwaPages(p) => p,
            other => panic!("{other:?}"),
        },
    };
    Reply::LockedPaired {
        lock,
        delta,
        swa_pages,
    }
}

/// `insert_with`, `walk` of the key and `swa_pages` of the walk's last
/// `tail` pages, as `InsertPaired` answers them.
fn insert_apart(
    e: &mut Engine,
    tokens: &[u32],
    pages: &[u32],
    lock: bool,
    extra: InsertExtra,
    tail: usize,
) -> Reply {
    let insert = Request::InsertWith {
        tokens: tokens.to_vec(),
        pages: pages.to_vec(),
        lock,
        mamba_state: extra.mamba_state,
        swa_evicted: extra.swa_evicted,
    };
    let Reply::InsertedWith {
        cached,
        len,
        handle,
        locked,
        mamba_exist,
    } = ok(e, insert)
    else {
        panic!("not an insert's answer")
    };
    let Reply::Matched { pages: walked, .. } = ok(
        e,
        Request::Walk {
            tokens: tokens.to_vec(),
        },
    ) else {
        panic!("not a walk's answer")
    };
    let tail = tail.min(walked.len());
    let swa_pages = match tail {
        0 => Vec::new(),
        _ => match ok(
            e,
            Request::SwaPages {
                pages: walked[walked.len() - tail..].to_vec(),
            },
        ) {
            Reply::SwaPages(p) => p,
            other => panic!("{other:?}"),
        },
    };
    Reply::InsertedPaired {
        cached,
        len,
        handle,
        locked,
        mamba_exist,
        pages: walked,
        swa_pages,
    }
}

fn insert_paired(
    tokens: &[u32],
    pages: &[u32],
    lock: bool,
    extra: InsertExtra,
    tail: u32,
) -> Request {
    Request::InsertPaired {
        tokens: tokens.to_vec(),
        pages: pages.to_vec(),
        lock,
        mamba_state: extra.mamba_state,
        swa_evicted: extra.swa_evicted,
        tail,
    }
}

fn handle_of(reply: &Reply) -> u64 {
    match reply {
        Reply::InsertedPaired {
            handle: Some(h), ..
        }
        | Reply::MatchedWith {
            handle: Some(h), ..
        } => *h,
        other => panic!("no handle in {other:?}"),
    }
}

#[test]
fn swa_paired_requests_answer_what_the_separate_ones_do() {
    // Twins: `a` gets the paired requests, `b` the separate ones.
    let (mut a, mut b) = (engine(swa_components()), engine(swa_components()));
    let none = InsertExtra::default();
    let got = ok(&mut a, Request::AllocPaired { n: 8 });
    let Reply::Pages(pages) = ok(&mut b, Request::Alloc { n: 8 }) else {
        panic!()
    };
    let Reply::SwaPages(peers) = ok(
        &mut b,
        Request::SwaPages {
            pages: pages.clone(),
        },
    ) else {
        panic!()
    };
    assert_eq!(
        got,
        Reply::PagesPaired {
            pages: pages.clone(),
            swa_pages: peers.clone()
        }
    );
    assert!(
        peers.iter().all(|&p| p != u32::MAX),
        "fresh pages are paired"
    );
    let key: Vec<u32> = (1..=16).collect();
    // A checkpoint: the insert, the lock, the key's pages and the
    // window's pairing.
    let got = ok(
        &mut a,
        insert_paired(&key[..12], &pages[..6], true, none, 3),
    );
    assert_eq!(
        got,
        insert_apart(&mut b, &key[..12], &pages[..6], true, none, 3)
    );
    let h = handle_of(&got);
    // Another request of a longer prompt, its out-of-window SWA pages
    // freed, inserted after SWA was evicted from the tree: the pairing of
    // its window is what the tree holds after.
    let Reply::PagesPaired { pages: more, .. } = ok(&mut a, Request::AllocPaired { n: 8 }) else {
        panic!()
    };
    assert_eq!(
        ok(&mut b, Request::Alloc { n: 8 }),
        Reply::Pages(more.clone())
    );
    for e in [&mut a, &mut b] {
        ok(
            e,
            Request::FreeSwa {
                pages: more[..2].to_vec(),
            },
        );
        ok(
            e,
            Request::EvictComponents {
                tokens: 0,
                swa_tokens: 8,
                mamba_states: 0,
            },
        );
    }
    let extra = InsertExtra {
        mamba_state: None,
        swa_evicted: 4,
    };
    let got = ok(&mut a, insert_paired(&key, &more, false, extra, 9));
    assert_eq!(got, insert_apart(&mut b, &key, &more, false, extra, 9));
    // A lock of the checkpoint's node, the window's pairing with it.
    let window = pages[3..6].to_vec();
    let got = ok(
        &mut a,
        Request::LockPaired {
            handle: h,
            pages: window.clone(),
        },
    );
    assert_eq!(got, lock_apart(&mut b, h, &window));
    let Reply::LockedPaired { lock, .. } = got else {
        panic!()
    };
    // Without pages: the lock and its delta alone.
    let m = ok(
        &mut a,
        Request::MatchWith {
            tokens: key.clone(),
            lock: false,
        },
    );
    assert_eq!(
        m,
        ok(
            &mut b,
            Request::MatchWith {
                tokens: key.clone(),
                lock: false
            }
        )
    );
    let got = ok(
        &mut a,
        Request::LockPaired {
            handle: handle_of(&m),
            pages: vec![],
        },
    );
    assert_eq!(got, lock_apart(&mut b, handle_of(&m), &[]));
    // Counted: the answer, and the counts `stats` says after it.
    for r in [
        Request::Unlock { handle: lock },
        Request::EvictComponents {
            tokens: 0,
            swa_tokens: 4,
            mamba_states: 0,
        },
        Request::AllocPaired { n: 2 },
        Request::Stats,
    ] {
        let want = ok(&mut b, r.clone());
        let counts = counts_of(&mut b);
        assert_eq!(
            ok(&mut a, counted(r.clone())),
            Reply::Counted {
                reply: Box::new(want),
                free: counts
            },
            "{r:?}"
        );
    }
    assert_eq!(state(&a), state(&b));
}

#[test]
fn mamba_paired_requests_answer_what_the_separate_ones_do() {
    let (mut a, mut b) = (engine(mamba_components()), engine(mamba_components()));
    let got = ok(&mut a, Request::AllocStates { n: 3 });
    let apart: Vec<u32> = (0..3)
        .map(|_| match ok(&mut b, Request::AllocState) {
            Reply::State { state } => state,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(got, Reply::States(apart.clone()));
    let Reply::Pages(pages) = ok(&mut a, Request::Alloc { n: 8 }) else {
        panic!()
    };
    ok(&mut b, Request::Alloc { n: 8 });
    // Two checkpoints take two of the states; the third is the key's
    // again, so it stays the caller's (`mamba_exist`).
    let key: Vec<u32> = (1..=16).collect();
    for (n, state) in [(8, apart[0]), (16, apart[1]), (16, apart[2])] {
        let extra = InsertExtra {
            mamba_state: Some(state),
            swa_evicted: 0,
        };
        let got = ok(
            &mut a,
            insert_paired(&key[..n], &pages[..n / 2], true, extra, 0),
        );
        assert_eq!(
            got,
            insert_apart(&mut b, &key[..n], &pages[..n / 2], true, extra, 0)
        );
    }
    // The pool: two cached (locked), one owned, one free. Two more take
    // the free one and evict nothing locked: refused whole.
    assert_eq!(
        run(&mut a, Request::AllocStates { n: 2 }).unwrap_err().kind,
        ErrorKind::InsufficientStates
    );
    // Unlocked, a cached state is evictable: two more are handed out as
    // two `alloc_state`s would, one of them evicted.
    for e in [&mut a, &mut b] {
        let m = ok(
            e,
            Request::MatchWith {
                tokens: key.clone(),
                lock: false,
            },
        );
        let h = handle_of(&m);
        ok(e, Request::Unlock { handle: h });
        ok(e, Request::Unlock { handle: h });
    }
    let before = state(&a);
    assert_eq!(before, state(&b));
    let got = ok(&mut a, Request::AllocStates { n: 2 });
    let apart2: Vec<u32> = (0..2)
        .map(|_| match ok(&mut b, Request::AllocState) {
            Reply::State { state } => state,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(got, Reply::States(apart2.clone()));
    assert_eq!(state(&a), state(&b));
    // Given back together, and counted.
    let mine = [apart[2], apart2[0], apart2[1]];
    let got = ok(
        &mut a,
        counted(Request::FreeStates {
            states: mine.to_vec(),
        }),
    );
    for s in mine {
        ok(
            &mut b,
            Request::FreeState {
                state: u64::from(s),
            },
        );
    }
    assert_eq!(
        got,
        Reply::Counted {
            reply: Box::new(Reply::Done),
            free: counts_of(&mut b)
        }
    );
    assert_eq!(state(&a), state(&b));
    assert_eq!(
        ok(&mut a, Request::AllocStates { n: 0 }),
        Reply::States(vec![])
    );
}

#[test]
fn bad_paired_requests_are_refused_and_change_nothing() {
    let refused = |e: &mut Engine, r: Request, kind: ErrorKind| {
        let before = state(e);
        let shown = format!("{r:?}");
        assert_eq!(run(e, r).map_err(|r| r.kind), Err(kind), "{shown}");
        assert_eq!(state(e), before, "{shown} changed something");
    };
    let mut swa = engine(swa_components());
    let Reply::Pages(pages) = ok(&mut swa, Request::Alloc { n: 4 }) else {
        panic!()
    };
    let key: Vec<u32> = (1..=8).collect();
    let r = ok(
        &mut swa,
        insert_paired(&key, &pages, true, InsertExtra::default(), 0),
    );
    let h = handle_of(&r);
    // A page beyond the pool: nothing locked (the lock's own unlock then
    // finds only the insert's lock).
    refused(
        &mut swa,
        Request::LockPaired {
            handle: h,
            pages: vec![pages[0], 999],
        },
        ErrorKind::PageOutOfRange,
    );
    ok(&mut swa, Request::Unlock { handle: h });
    assert_eq!(
        swa.stats().protected_tokens,
        0,
        "the refused lock took nothing"
    );
    refused(
        &mut swa,
        Request::LockPaired {
            handle: 12345,
            pages: vec![],
        },
        ErrorKind::UnknownHandle,
    );
    refused(
        &mut swa,
        Request::AllocStates { n: 1 },
        ErrorKind::ComponentOff,
    );
    refused(
        &mut swa,
        Request::FreeStates { states: vec![0] },
        ErrorKind::ComponentOff,
    );
    refused(
        &mut swa,
        Request::AllocPaired { n: 999 },
        ErrorKind::InsufficientPages,
    );
    // What takes no count, counted.
    refused(&mut swa, counted(Request::Reset), ErrorKind::Malformed);
    refused(&mut swa, counted(Request::Validate), ErrorKind::Malformed);
    refused(
        &mut swa,
        counted(counted(Request::Stats)),
        ErrorKind::Malformed,
    );
    // A counted request refused is refused whole.
    refused(
        &mut swa,
        counted(Request::Free {
            pages: vec![pages[0]],
        }),
        ErrorKind::PageNotOwned,
    );

    let mut full = Engine::new(Config {
        page_size: 2,
        capacity: 8,
    })
    .unwrap();
    let Reply::Pages(pages) = ok(&mut full, Request::Alloc { n: 2 }) else {
        panic!()
    };
    // Without SWA a pairing cannot be asked: nothing inserted or locked.
    refused(
        &mut full,
        insert_paired(&key[..4], &pages, true, InsertExtra::default(), 1),
        ErrorKind::ComponentOff,
    );
    let r = ok(
        &mut full,
        insert_paired(&key[..4], &pages, true, InsertExtra::default(), 0),
    );
    let Reply::InsertedPaired {
        pages: kept,
        swa_pages,
        ..
    } = &r
    else {
        panic!()
    };
    assert_eq!((&kept[..], &swa_pages[..]), (&pages[..], &[][..]));
    refused(
        &mut full,
        Request::LockPaired {
            handle: handle_of(&r),
            pages: pages.clone(),
        },
        ErrorKind::ComponentOff,
    );
    // Alloc paired without SWA: no peers.
    assert_eq!(
        ok(&mut full, Request::AllocPaired { n: 1 }),
        Reply::PagesPaired {
            pages: vec![pages[1] + 1],
            swa_pages: vec![]
        }
    );

    let mut mamba = engine(mamba_components());
    let Reply::States(states) = ok(&mut mamba, Request::AllocStates { n: 2 }) else {
        panic!()
    };
    refused(
        &mut mamba,
        Request::AllocStates { n: 3 },
        ErrorKind::InsufficientStates,
    );
    refused(
        &mut mamba,
        Request::AllocStates { n: u64::MAX },
        ErrorKind::InsufficientStates,
    );
    // One not owned, or one named twice: none freed.
    refused(
        &mut mamba,
        Request::FreeStates {
            states: vec![states[0], 3],
        },
        ErrorKind::StateNotOwned,
    );
    refused(
        &mut mamba,
        Request::FreeStates {
            states: vec![states[0], states[0]],
        },
        ErrorKind::StateNotOwned,
    );
    ok(&mut mamba, Request::FreeStates { states });
}

fn swa_daemon() -> Daemon {
    Daemon::start(&[
        "--page-size",
        "2",
        "--capacity",
        "24",
        "--components",
        "full,swa",
        "--swa-window",
        "4",
        "--swa-capacity",
        "24",
    ])
}

fn counts(c: &mut Client) -> FreeCounts {
    let (stats, _) = c.stats().unwrap();
    let comps = c.component_stats().unwrap().unwrap_or_default();
    FreeCounts {
        pages: stats.free_pages,
        swa_pages: comps.swa_free_pages,
        mamba_states: comps.mamba_free_states,
    }
}

#[test]
fn through_a_daemon_the_paired_calls_answer_as_the_separate_ones() {
    // Twin daemons: `a` makes the paired calls, `b` the separate ones.
    let (da, db) = (swa_daemon(), swa_daemon());
    let (mut a, mut b) = (
        Client::connect(&da.name).unwrap(),
        Client::connect(&db.name).unwrap(),
    );
    let (pages, peers) = a.alloc_paired(8).unwrap();
    let apart = b.alloc(8).unwrap();
    assert_eq!(pages, apart);
    let want: Vec<Option<u32>> = peers.iter().map(|&p| Some(p)).collect();
    assert_eq!(b.swa_pages(&apart).unwrap(), want);
    let key: Vec<u32> = (1..=12).collect();
    let none = InsertExtra::default();
    let got = a.insert_paired(&key, &pages[..6], true, none, 3).unwrap();
    let (ins, ie) = b.insert_with(&key, &pages[..6], true, none).unwrap();
    assert_eq!((got.result, got.mamba_exist), (ins, ie.mamba_exist));
    let (len, walked) = b.peek_anchored(&key).unwrap();
    assert_eq!((len.len, &got.pages), (12, &walked));
    assert_eq!(got.swa_pages, b.swa_pages(&walked[3..]).unwrap());
    let h = got.result.handle.unwrap();
    let locked = a.lock_paired(h, &pages[3..6]).unwrap();
    let before = b.stats().unwrap().0.protected_tokens as i64;
    let lock = b.lock(ins.handle.unwrap()).unwrap();
    let after = b.stats().unwrap().0.protected_tokens as i64;
    assert_eq!(
        (locked.lock, locked.delta, locked.swa_pages),
        (lock, before - after, b.swa_pages(&pages[3..6]).unwrap())
    );
    // Through the daemon a bad page is refused before the lock too.
    let protected = a.stats().unwrap().0.protected_tokens;
    match a.lock_paired(h, &[999]) {
        Err(ClientError::Rejected(r)) => assert_eq!(r.kind, ErrorKind::PageOutOfRange),
        other => panic!("{other:?}"),
    }
    assert_eq!(a.stats().unwrap().0.protected_tokens, protected);
    a.validate().unwrap();
    b.validate().unwrap();
}

#[test]
fn state_slots_go_and_come_back_together_through_a_daemon() {
    let daemon = Daemon::start(&[
        "--page-size",
        "2",
        "--capacity",
        "8",
        "--components",
        "full,mamba",
        "--mamba-capacity",
        "4",
    ]);
    let mut c = Client::connect(&daemon.name).unwrap();
    let states = c.alloc_states(3).unwrap();
    assert_eq!(states.len(), 3);
    assert_eq!(c.free_counts().unwrap().mamba_states, 1);
    match c.alloc_states(2) {
        Err(ClientError::Rejected(r)) => assert_eq!(r.kind, ErrorKind::InsufficientStates),
        other => panic!("{other:?}"),
    }
    c.free_states(&states).unwrap();
    assert_eq!(c.free_counts().unwrap().mamba_states, 4);
    assert_eq!(counts(&mut c).mamba_states, 4);
    // A client that goes away gives its states back.
    let mut gone = Client::connect(&daemon.name).unwrap();
    assert_eq!(gone.alloc_states(4).unwrap().len(), 4);
    drop(gone);
    common::wait_for(std::time::Duration::from_secs(2), || {
        match c.free_counts().unwrap().mamba_states {
            4 => Ok(()),
            n => Err(format!("{n} states free")),
        }
    });
}

#[test]
fn kept_free_counts_are_the_daemon_s_whoever_changed_them() {
    let daemon = swa_daemon();
    let mut a = Client::connect(&daemon.name).unwrap();
    let mut other = Client::connect(&daemon.name).unwrap();
    let check = |a: &mut Client, other: &mut Client, what: &str| {
        assert_eq!(a.free_counts().unwrap(), counts(other), "{what}");
    };
    check(&mut a, &mut other, "at first");
    let (pages, _) = a.alloc_paired(5).unwrap();
    check(&mut a, &mut other, "after this client's alloc");
    let key: Vec<u32> = (1..=10).collect();
    a.insert_paired(&key, &pages, false, InsertExtra::default(), 0)
        .unwrap();
    check(&mut a, &mut other, "after its insert");
    // Another client's changes, and this client's own calls that carry
    // no counts (a batch), are seen.
    let theirs = other.alloc(3).unwrap();
    check(&mut a, &mut other, "after another client's alloc");
    other.free_swa(&theirs[..1]).unwrap();
    check(&mut a, &mut other, "after another client's free_swa");
    let more = a.alloc(2).unwrap();
    a.batch(&[Request::Free { pages: more }]).unwrap();
    check(&mut a, &mut other, "after a batch");
    other.evict_components(4, 4, 0).unwrap();
    check(&mut a, &mut other, "after another client's eviction");
    drop(other);
    let mut last = Client::connect(&daemon.name).unwrap();
    common::wait_for(std::time::Duration::from_secs(2), || {
        let (kept, now) = (a.free_counts().unwrap(), counts(&mut last));
        match kept == now {
            true => Ok(()),
            false => Err(format!("kept {kept:?}, the daemon has {now:?}")),
        }
    });
}

#[test]
fn kept_free_counts_answer_without_a_round_trip() {
    let daemon = swa_daemon();
    let mut a = Client::connect(&daemon.name).unwrap();
    a.free_counts().unwrap();
    a.alloc_paired(2).unwrap();
    let requests = |name: &str| -> u64 {
        let out = common::stat(name);
        let line = out.lines().find(|l| l.starts_with("requests")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    // The figure goes out once the daemon has caught up.
    let before = common::wait_for(std::time::Duration::from_secs(5), || {
        match requests(&daemon.name) {
            n if n >= 2 => Ok(n),
            n => Err(format!("{n} requests")),
        }
    });
    for _ in 0..200 {
        a.free_counts().unwrap();
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(
        requests(&daemon.name) < before + 10,
        "the counts were asked"
    );
}

#[test]
fn ranks_of_a_group_keep_the_same_counts_and_stay_in_step() {
    let daemon = swa_daemon();
    let ranks: Vec<_> = (0..2)
        .map(|r| {
            let name = daemon.name.clone();
            std::thread::spawn(move || {
                let mut c = Client::connect(&name).unwrap();
                c.join("hybrid", r, 2).unwrap();
                let key: Vec<u32> = (1..=8).collect();
                let mut seen = vec![c.free_counts().unwrap()];
                let (pages, peers) = c.alloc_paired(4).unwrap();
                seen.push(c.free_counts().unwrap());
                let ins = c
                    .insert_paired(&key, &pages, true, InsertExtra::default(), 2)
                    .unwrap();
                seen.push(c.free_counts().unwrap());
                let h = ins.result.handle.unwrap();
                let locked = c.lock_paired(h, &pages[2..]).unwrap();
                c.unlock(locked.lock).unwrap();
                c.unlock(h).unwrap();
                c.evict_components(8, 0, 0).unwrap();
                seen.push(c.free_counts().unwrap());
                // The connection goes back with the answers: a rank that
                // left before the other joined would finish the group.
                ((seen, pages, peers, ins, locked), c)
            })
        })
        .collect();
    let (answers, clients): (Vec<_>, Vec<_>) = ranks.into_iter().map(|t| t.join().unwrap()).unzip();
    drop(clients);
    assert_eq!(answers[0], answers[1]);
    let seen = &answers[0].0;
    assert_eq!(seen[0].pages, 24);
    assert_eq!(seen[1].pages, 20);
    assert_eq!(seen[3].pages, 24, "evicted back");
}
