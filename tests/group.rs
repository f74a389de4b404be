//! The ranks of one tensor-parallel server on one tree, through the real
//! daemon (`crate::group`): ranks running the same scheduler steps in
//! threads of their own get every answer alike and leave the tree one rank
//! alone would have built (KV events published once); a rank out of step
//! is told which step and both operations; a rank far ahead waits for the
//! slowest; a killed rank leaves, the group goes on, and its last rank takes
//! the group's locks and pages with it; joins that disagree, or come late,
//! are refused and change nothing; `exec` speaks `join`.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::{assert_mentions, stat, stat_showing, wait_for, Daemon, Exec, Rng, PUBLISH_DEADLINE};
use radixd::engine::{Config, Engine};
use radixd::op::{apply, ErrorKind, Reply, Request};
use radixd::{Client, ClientError};
use serde_json::json;

const P: u32 = 4;
const PAGES: u32 = 48;

/// One scheduler's run: `steps` scheduler steps (match+lock, alloc the
/// rest, insert, unlock, and now and then stats and an evict) drawn from
/// `seed`, each call through `call`; returns every answer in order.
fn scheduler(
    seed: u64,
    steps: usize,
    mut call: impl FnMut(Request) -> Result<Reply, radixd::op::Rejection>,
) -> Vec<Result<Reply, radixd::op::Rejection>> {
    let mut rng = Rng(seed);
    let mut out = Vec::new();
    for _ in 0..steps {
        let system = rng.below(3) as u32;
        let len = (rng.below(6) as u32 + 1) * P + rng.below(P as u64) as u32;
        let tokens: Vec<u32> = (0..len)
            .map(|i| {
                if i < 2 * P {
                    system * 1000 + i
                } else {
                    rng.below(50) as u32
                }
            })
            .collect();
        let m = call(Request::Match {
            tokens: tokens.clone(),
            lock: true,
        });
        let (mut pages, handle) = match &m {
            Ok(Reply::Matched { pages, handle, .. }) => (pages.clone(), *handle),
            _ => (Vec::new(), None),
        };
        out.push(m);
        let need = (len / P) as u64 - pages.len() as u64;
        let a = call(Request::Alloc { n: need });
        if let Ok(Reply::Pages(fresh)) = &a {
            pages.extend(fresh);
            out.push(call(Request::Insert {
                tokens,
                pages,
                lock: false,
            }));
        }
        out.push(a);
        if let Some(handle) = handle {
            out.push(call(Request::Unlock { handle }));
        }
        match rng.below(4) {
            0 => out.push(call(Request::Stats)),
            1 => out.push(call(Request::Evict {
                tokens: 2 * u64::from(P),
            })),
            _ => {}
        }
    }
    out
}

fn rejected(e: ClientError) -> radixd::op::Rejection {
    match e {
        ClientError::Rejected(r) => r,
        e => panic!("expected a rejection, got {e:?}"),
    }
}

fn rank(name: &str, group: &str, r: u32, size: u32) -> Client {
    let mut c = Client::connect(name).unwrap();
    c.join(group, r, size).unwrap();
    c
}

/// Runs `ranks` ranks of one group through the daemon, each in a thread,
/// the same steps; returns their answers.
fn run_ranks(
    name: &str,
    group: &str,
    ranks: u32,
    steps: usize,
) -> Vec<Vec<Result<Reply, radixd::op::Rejection>>> {
    let threads: Vec<_> = (0..ranks)
        .map(|r| {
            let (name, group) = (name.to_owned(), group.to_owned());
            thread::spawn(move || {
                let mut c = rank(&name, &group, r, ranks);
                let answers = scheduler(11, steps, |q| c.call(&q).map_err(rejected));
                (answers, c)
            })
        })
        .collect();
    let mut clients = Vec::new();
    let answers = threads
        .into_iter()
        .map(|t| {
            let (a, c) = t.join().unwrap();
            clients.push(c);
            a
        })
        .collect();
    drop(clients);
    answers
}

#[test]
fn ranks_get_the_answers_one_rank_alone_gets_and_share_one_tree() {
    for ranks in [2, 4] {
        let daemon = Daemon::start(&["--page-size", "4", "--capacity", "48"]);
        let mut alone = Engine::new(Config {
            page_size: P,
            capacity: PAGES,
        })
        .unwrap();
        let expected = scheduler(11, 400, |q| apply(&mut alone, 0, q));
        // The ranks stay connected while the tree is compared: the group's
        // unlocked prefixes stay cached after they go, but compare first.
        let threads: Vec<_> = (0..ranks)
            .map(|r| {
                let name = daemon.name.clone();
                thread::spawn(move || {
                    let mut c = rank(&name, "tp", r, ranks);
                    let answers = scheduler(11, 400, |q| c.call(&q).map_err(rejected));
                    (answers, c)
                })
            })
            .collect();
        let mut held = Vec::new();
        for (r, t) in threads.into_iter().enumerate() {
            let (answers, c) = t.join().unwrap();
            assert_eq!(answers.len(), expected.len(), "rank {r}");
            for (i, (got, want)) in answers.iter().zip(&expected).enumerate() {
                assert_eq!(got, want, "rank {r} of {ranks}, answer {i}");
            }
            held.push(c);
        }
        let mut watcher = Client::connect(&daemon.name).unwrap();
        let (stats, _) = watcher.stats().unwrap();
        assert_eq!(stats, alone.stats(), "the tree is held once, as one rank's");
        watcher.validate().unwrap();
        // Every prefix one rank alone cached, the daemon has, with its pages.
        for tokens in [vec![0, 1, 2, 3, 4, 5, 6, 7], vec![1000, 1001, 1002, 1003]] {
            let mut pages = Vec::new();
            let m = alone.match_prefix(0, &tokens, false, &mut pages);
            assert_eq!(watcher.peek(&tokens).unwrap(), (m.len, pages));
        }
        drop(held);
        let s = wait_stats(&mut watcher, |s| {
            s.owned_pages == 0 && s.protected_tokens == 0
        });
        assert_eq!(s.total_tokens, alone.stats().total_tokens);
    }
}

/// Waits until the daemon's figures satisfy `ok` (it notices departures
/// within a sweep).
fn wait_stats(
    c: &mut Client,
    ok: impl Fn(&radixd::engine::Stats) -> bool,
) -> radixd::engine::Stats {
    let start = Instant::now();
    loop {
        let s = c.stats().unwrap().0;
        if ok(&s) {
            return s;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "still {s:?}");
        thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_rank_out_of_step_gets_an_error_naming_the_step_and_both_operations() {
    let daemon = Daemon::start(&["--page-size", "4", "--capacity", "48"]);
    let mut r0 = rank(&daemon.name, "g", 0, 2);
    let mut r1 = rank(&daemon.name, "g", 1, 2);
    r0.alloc(2).unwrap();
    r0.stats().unwrap();
    // `radixd stat` shows the group and the steps kept for rank 1.
    stat_showing(
        &daemon.name,
        &["groups      1 tensor-parallel group(s), 2 ranks connected, 2 steps kept"],
    );
    assert_eq!(r1.alloc(2).unwrap().len(), 2);
    let err = rejected(r1.evict(8).unwrap_err());
    assert_eq!(err.kind, ErrorKind::Desync);
    assert_mentions(
        &err.message,
        &[
            "rank 1 of group \"g\"",
            "step 1",
            "it sent evict of 8 tokens",
            "rank 0 sent stats",
        ],
    );
    // From then on, only that error; rank 0 goes on alone.
    assert_eq!(rejected(r1.stats().unwrap_err()).kind, ErrorKind::Desync);
    r0.evict(4).unwrap();
    // Requests outside the steps still work for it.
    r1.validate().unwrap();
}

#[test]
fn a_rank_far_ahead_waits_for_the_slowest_rank() {
    let daemon = Daemon::start(&["--page-size", "4", "--capacity", "48"]);
    let done = Arc::new(AtomicU64::new(0));
    // Whole batches of 64 reach the limit exactly.
    let steps = radixd::group::LAG_STEPS as u64 + 640;
    let mut r1 = rank(&daemon.name, "g", 1, 2);
    let ahead = {
        let (name, done) = (daemon.name.clone(), done.clone());
        thread::spawn(move || {
            let mut r0 = rank(&name, "g", 0, 2);
            let batch = vec![Request::Stats; 64];
            while done.load(Ordering::Relaxed) < steps {
                for a in r0.batch(&batch).unwrap() {
                    if let Err(e) = a {
                        panic!("after {} steps: {e}", done.load(Ordering::Relaxed));
                    }
                }
                done.fetch_add(64, Ordering::Relaxed);
            }
            r0
        })
    };
    let start = Instant::now();
    while done.load(Ordering::Relaxed) < radixd::group::LAG_STEPS as u64 {
        assert!(start.elapsed() < Duration::from_secs(60));
        thread::sleep(Duration::from_millis(5));
    }
    thread::sleep(Duration::from_millis(200));
    assert_eq!(
        done.load(Ordering::Relaxed),
        radixd::group::LAG_STEPS as u64,
        "rank 0 waits at the limit"
    );
    // Rank 1 catches up: rank 0 goes on.
    let batch = vec![Request::Stats; 64];
    for _ in 0..steps / 64 {
        for a in r1.batch(&batch).unwrap() {
            a.unwrap();
        }
    }
    let r0 = ahead.join().unwrap();
    assert_eq!(done.load(Ordering::Relaxed), steps);
    drop(r0);
}

#[test]
fn a_killed_rank_leaves_and_the_last_one_takes_the_groups_holdings() {
    let daemon = Daemon::start(&["--page-size", "4", "--capacity", "48"]);
    let mut watcher = Client::connect(&daemon.name).unwrap();
    let mut ranks: Vec<Exec> = (0..2)
        .map(|_| Exec::start(&["--connect", &daemon.name]))
        .collect();
    for (r, e) in ranks.iter_mut().enumerate() {
        let answer = e.call(json!({"op":"join","group":"srv","rank":r,"size":2}));
        assert_eq!(answer, json!({"ok":true,"joined":r + 1,"size":2}));
    }
    let steps = [
        json!({"op":"alloc","n":2}),
        json!({"op":"insert","tokens":[1,2,3,4,5,6,7,8],"pages":[0,1],"lock":true}),
        json!({"op":"alloc","n":1}),
    ];
    let mut answers = Vec::new();
    for e in ranks.iter_mut() {
        answers.push(steps.iter().map(|s| e.call(s.clone())).collect::<Vec<_>>());
    }
    assert_eq!(answers[0], answers[1]);
    assert_eq!(answers[0][1]["ok"], true, "{:?}", answers[0]);
    // Rank 0 leads one more step and dies before rank 1 takes it.
    let evict = json!({"op":"evict","tokens":4});
    let led = ranks[0].call(evict.clone());
    ranks[0].kill(libc::SIGKILL);
    assert_eq!(
        ranks[1].call(evict),
        led,
        "the step it led is still rank 1's"
    );
    thread::sleep(Duration::from_millis(300));
    let s = watcher.stats().unwrap().0;
    assert_eq!(
        (s.protected_tokens, s.owned_pages),
        (8, 1),
        "the group goes on"
    );
    ranks[1].kill(libc::SIGKILL);
    let s = wait_stats(&mut watcher, |s| {
        s.protected_tokens == 0 && s.owned_pages == 0
    });
    assert_eq!(s.total_tokens, 8, "the prefix stays cached, unlocked");
    watcher.validate().unwrap();
    // The group is finished: its ranks (or anyone) cannot join it again.
    let mut late = Exec::start(&["--connect", &daemon.name]);
    let answer = late.call(json!({"op":"join","group":"srv","rank":1,"size":2}));
    assert_eq!(answer["error"], "group_closed", "{answer}");
}

#[test]
fn joins_that_disagree_are_refused_and_change_nothing() {
    let daemon = Daemon::start(&["--page-size", "4", "--capacity", "48"]);
    let _r0 = rank(&daemon.name, "g", 0, 2);
    let mut e = Exec::start(&["--connect", &daemon.name]);
    for (join, kind, says) in [
        (
            json!({"op":"join","group":"g","rank":1,"size":4}),
            "group_mismatch",
            "has 2 ranks",
        ),
        (
            json!({"op":"join","group":"g","rank":1,"size":2,"page_size":8}),
            "group_mismatch",
            "pages of 8 tokens",
        ),
        (
            json!({"op":"join","group":"g","rank":0,"size":2}),
            "group_closed",
            "joined already",
        ),
        (
            json!({"op":"join","group":"","rank":0,"size":1}),
            "malformed",
            "1..=256 bytes",
        ),
        (
            json!({"op":"join","group":"h","rank":0,"size":1,"extra":1}),
            "malformed",
            "unknown field \"extra\"",
        ),
        (
            json!({"op":"join","group":"h","rank":-1,"size":1}),
            "malformed",
            "\"rank\"",
        ),
        (
            json!({"op":"join","group":"h","rank":0,"size":99}),
            "group_mismatch",
            "not 99",
        ),
    ] {
        let answer = e.call(join.clone());
        assert_eq!(answer["error"], kind, "{join} -> {answer}");
        assert_mentions(answer["message"].as_str().unwrap(), &[says]);
    }
    // Still free to join after all those.
    let answer = e.call(json!({"op":"join","group":"g","rank":1,"size":2}));
    assert_eq!(answer, json!({"ok":true,"joined":2,"size":2}));
    // A connection that worked alone first cannot become a rank.
    let mut solo = Exec::start(&["--connect", &daemon.name]);
    assert_eq!(solo.call(json!({"op":"alloc","n":1}))["ok"], true);
    let answer = solo.call(json!({"op":"join","group":"k","rank":0,"size":1}));
    assert_eq!(answer["error"], "group_mismatch", "{answer}");
    // An in-process engine has no groups.
    let mut local = Exec::start(&["--page-size", "4", "--capacity", "8"]);
    let answer = local.call(json!({"op":"join","group":"k","rank":0,"size":1}));
    assert_eq!(answer["error"], "not_permitted", "{answer}");
}

#[test]
fn two_groups_on_one_daemon_never_mix() {
    let daemon = Daemon::start(&["--page-size", "4", "--capacity", "48"]);
    let mut a = rank(&daemon.name, "server-a", 0, 1);
    let mut b = rank(&daemon.name, "server-b", 0, 1);
    let pa = a.alloc(1).unwrap();
    let pb = b.alloc(1).unwrap();
    assert_ne!(pa, pb);
    // Each group's pages are its own.
    assert_eq!(
        rejected(b.free(&pa).unwrap_err()).kind,
        ErrorKind::PageNotOwned
    );
    a.free(&pa).unwrap();
    b.free(&pb).unwrap();
}

#[cfg(feature = "kv-events")]
#[test]
fn kv_events_are_published_once_per_step_not_once_per_rank() {
    use radixd::events::batch::KvEvent;
    use radixd::events::subscriber::Subscriber;

    // (stored, removed) block counts of a daemon's whole event history.
    let history = |ranks: u32| -> (usize, usize) {
        let base = format!("/tmp/radixd-group-ev-{}-{ranks}", std::process::id());
        let (ep, rep) = (format!("ipc://{base}.pub"), format!("ipc://{base}.replay"));
        let daemon = Daemon::start(&[
            "--page-size",
            "4",
            "--capacity",
            "48",
            "--kv-events",
            &ep,
            "--kv-events-replay",
            &rep,
            "--kv-events-buffer",
            "1000000",
        ]);
        let answers = run_ranks(&daemon.name, "ev", ranks, 200);
        assert!(answers.windows(2).all(|w| w[0] == w[1]));
        thread::sleep(Duration::from_millis(400));
        let mut sub = Subscriber::connect(&ep, "", Some(&rep)).expect("subscribe");
        sub.replay_from(0, Duration::from_secs(20)).expect("replay");
        let (mut stored, mut removed) = (0, 0);
        while let Some(r) = sub.recv(Duration::from_millis(300)).expect("recv") {
            for e in r.batch.events {
                match e {
                    KvEvent::BlockStored { block_hashes, .. } => stored += block_hashes.len(),
                    KvEvent::BlockRemoved { block_hashes, .. } => removed += block_hashes.len(),
                    KvEvent::AllBlocksCleared => {}
                }
            }
        }
        (stored, removed)
    };
    let one = history(1);
    assert!(one.0 > 0 && one.1 > 0, "{one:?}");
    assert_eq!(history(3), one);
}

/// The daemon's `requests` figure once it has reached `at_least` and then
/// stopped moving. The figure goes out when the daemon catches up, after
/// its answers, so the count a test expects is waited for; "stopped
/// moving" then shows any requests beyond it.
fn daemon_requests(name: &str, at_least: u64) -> u64 {
    let read = || {
        let out = stat(name);
        let line = out
            .lines()
            .find(|l| l.starts_with("requests"))
            .unwrap()
            .to_owned();
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    let mut last = wait_for(PUBLISH_DEADLINE, || match read() {
        n if n >= at_least => Ok(n),
        n => Err(format!("{n} requests published, not yet {at_least}")),
    });
    loop {
        thread::sleep(Duration::from_millis(60));
        let now = read();
        if now == last {
            return now;
        }
        last = now;
    }
}

#[test]
fn ranks_take_the_steps_another_rank_led_off_the_board_without_asking_the_daemon() {
    let daemon = Daemon::start(&["--page-size", "4", "--capacity", "48"]);
    let mut r0 = rank(&daemon.name, "g", 0, 2);
    let mut r1 = rank(&daemon.name, "g", 1, 2);
    // The group's figures go out with the request count: once they show
    // rank 1, the count has both joins.
    stat_showing(&daemon.name, &["2 ranks connected"]);
    let before = daemon_requests(&daemon.name, 0);
    let led: Vec<_> = (0..30)
        .map(|i| (r0.alloc(1).unwrap(), r0.stats().unwrap(), i))
        .collect();
    let took: Vec<_> = (0..30)
        .map(|i| (r1.alloc(1).unwrap(), r1.stats().unwrap(), i))
        .collect();
    assert_eq!(took, led);
    let after = daemon_requests(&daemon.name, before + 60);
    assert_eq!(after - before, 60, "rank 1's 60 steps came off the board");
    // Past the board's 64 slots, the daemon answers the rank behind.
    for _ in 0..100 {
        r0.stats().unwrap();
    }
    // Rank 0 leads each of them: the daemon answers all 100.
    let before = daemon_requests(&daemon.name, after + 100);
    for _ in 0..100 {
        r1.stats().unwrap();
    }
    let behind = 100 - radixd_ipc::BOARD_SLOTS as u64;
    let asked = daemon_requests(&daemon.name, before + behind) - before;
    assert_eq!(asked, behind, "the last 64 off the board");
}
