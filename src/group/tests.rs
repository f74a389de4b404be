use super::*;
use crate::engine::{Config, Engine};
use crate::op::{apply, Reply, Request};

const PAGE: u32 = 4;

/// xorshift, so runs repeat exactly.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u32) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % u64::from(n.max(1))) as u32
    }
}

fn engine() -> Engine {
    Engine::new(Config {
        page_size: PAGE,
        capacity: 64,
    })
    .unwrap()
}

fn join(key: &str, rank: u32, size: u32) -> Join {
    Join {
        group: key.to_owned(),
        rank,
        size,
        page_size: PAGE,
    }
}

/// `groups.step` on `engine` for `client`.
fn step(
    groups: &mut Groups,
    engine: &mut Engine,
    client: ClientId,
    request: Request,
) -> Result<Reply, Rejection> {
    groups
        .step(client, request, |c, r| apply(engine, c, r))
        .expect("a member")
}

/// A scheduler's calls, drawn from `seed`: match+lock, alloc, insert,
/// unlock, sometimes stats, evict or free.
fn calls(seed: u64, n: usize) -> Vec<Request> {
    let mut rng = Rng(seed);
    let mut out = Vec::new();
    for i in 0..n {
        let tokens: Vec<u32> = (0..rng.below(5) * PAGE + PAGE)
            .map(|t| rng.below(3) * 100 + t)
            .collect();
        out.push(match i % 5 {
            0 => Request::Match { tokens, lock: true },
            1 => Request::Stats,
            2 => Request::Alloc {
                n: u64::from(rng.below(3)),
            },
            3 => Request::Evict {
                tokens: u64::from(rng.below(8)),
            },
            _ => Request::Match {
                tokens,
                lock: false,
            },
        });
    }
    out
}

/// What a rank does with an answer: the calls that depend on it (an
/// insert of the pages it got, an unlock of the handle it locked), as a
/// scheduler would.
fn follow_up(request: &Request, answer: &Result<Reply, Rejection>) -> Vec<Request> {
    match (request, answer) {
        (Request::Alloc { .. }, Ok(Reply::Pages(pages))) if !pages.is_empty() => {
            let tokens = (0..pages.len() as u32 * PAGE).map(|t| 7_000 + t).collect();
            vec![Request::Insert {
                tokens,
                pages: pages.clone(),
                lock: false,
            }]
        }
        (
            Request::Match { lock: true, .. },
            Ok(Reply::Matched {
                handle: Some(h), ..
            }),
        ) => vec![Request::Unlock { handle: *h }],
        _ => Vec::new(),
    }
}

/// Runs `calls` (and their follow-ups) as `ranks` ranks interleaved by
/// `order`, and alone on a second engine; every rank must get the alone
/// run's answers, and the engines must end the same.
fn lockstep(ranks: u32, order: &mut impl FnMut() -> u32) {
    let script = calls(u64::from(ranks) * 7 + 1, 300);
    // The solo run: the answers every rank must get.
    let mut alone = engine();
    let mut expected = Vec::new();
    for r in &script {
        let a = apply(&mut alone, 0, r.clone());
        let then = follow_up(r, &a);
        expected.push((describe(r), a));
        for f in then {
            let b = apply(&mut alone, 0, f.clone());
            expected.push((describe(&f), b));
        }
    }
    let mut shared = engine();
    let mut groups = Groups::new();
    for rank in 0..ranks {
        groups
            .join(rank, false, &join("g", rank, ranks), PAGE)
            .unwrap();
    }
    // Each rank replays the script, answering follow-ups from its own
    // answers (never from the expected ones).
    let mut at = vec![0usize; ranks as usize];
    let mut queued: Vec<Vec<Request>> = vec![Vec::new(); ranks as usize];
    let mut got: Vec<Vec<(Request, Result<Reply, Rejection>)>> = vec![Vec::new(); ranks as usize];
    while at.iter().any(|&i| i < script.len()) {
        let rank = order() % ranks;
        let r = rank as usize;
        let request = match queued[r].pop() {
            Some(f) => f,
            None if at[r] < script.len() => {
                at[r] += 1;
                script[at[r] - 1].clone()
            }
            None => continue,
        };
        let answer = step(&mut groups, &mut shared, rank, request.clone());
        queued[r].extend(follow_up(&request, &answer));
        got[r].push((request, answer));
    }
    for r in 0..ranks as usize {
        while let Some(f) = queued[r].pop() {
            let answer = step(&mut groups, &mut shared, r as u32, f.clone());
            got[r].push((f, answer));
        }
    }
    let order_of = |v: &Vec<(Request, Result<Reply, Rejection>)>| {
        v.iter()
            .map(|(q, a)| (describe(q), a.clone()))
            .collect::<Vec<_>>()
    };
    for (rank, answers) in got.iter().enumerate() {
        assert_eq!(order_of(answers), expected, "rank {rank}");
    }
    assert_eq!(
        apply(&mut shared, 0, Request::Stats),
        apply(&mut alone, 0, Request::Stats)
    );
    shared.validate().unwrap();
    // Every step was taken by every rank: nothing is kept.
    assert_eq!(groups.figures().kept_steps, 0);
}

#[test]
fn ranks_in_any_interleaving_get_the_answers_one_rank_alone_gets() {
    for ranks in [1, 2, 4, 8] {
        // Round robin, one rank far ahead, and a pseudo-random order.
        let mut i = 0u32;
        lockstep(ranks, &mut || {
            i += 1;
            i
        });
        let mut i = 0u32;
        lockstep(ranks, &mut || {
            i += 1;
            if i < 2_000 {
                0
            } else {
                i
            }
        });
        let mut rng = Rng(99);
        lockstep(ranks, &mut || rng.below(1 << 20));
    }
}

#[test]
fn a_step_is_carried_out_once_by_the_group() {
    let mut e = engine();
    let mut g = Groups::new();
    g.join(3, false, &join("g", 0, 2), PAGE).unwrap();
    g.join(5, false, &join("g", 1, 2), PAGE).unwrap();
    let a = step(&mut g, &mut e, 3, Request::Alloc { n: 2 }).unwrap();
    let b = step(&mut g, &mut e, 5, Request::Alloc { n: 2 }).unwrap();
    assert_eq!(a, b);
    // Two pages went, not four, and they are the group's: either rank
    // frees them (once, as a step).
    assert_eq!(e.stats().owned_pages, 2);
    let Reply::Pages(pages) = a else { panic!() };
    assert!(e.free(3, &pages).is_err(), "not the rank's own");
    step(
        &mut g,
        &mut e,
        5,
        Request::Free {
            pages: pages.clone(),
        },
    )
    .unwrap();
    step(&mut g, &mut e, 3, Request::Free { pages }).unwrap();
    assert_eq!(e.stats().owned_pages, 0);
}

#[test]
fn a_rank_out_of_step_is_told_which_step_and_both_operations() {
    let mut e = engine();
    let mut g = Groups::new();
    for rank in 0..3 {
        g.join(rank, false, &join("tp", rank, 3), PAGE).unwrap();
    }
    step(&mut g, &mut e, 0, Request::Stats).unwrap();
    step(&mut g, &mut e, 0, Request::Alloc { n: 1 }).unwrap();
    step(&mut g, &mut e, 1, Request::Stats).unwrap();
    let err = step(
        &mut g,
        &mut e,
        1,
        Request::Match {
            tokens: vec![1, 2, 3, 4],
            lock: false,
        },
    )
    .unwrap_err();
    assert_eq!(err.kind, ErrorKind::Desync);
    assert!(err.message.contains("step 1"), "{err}");
    assert!(
        err.message.contains("match of 4 tokens [1, 2, 3, 4]"),
        "{err}"
    );
    assert!(
        err.message.contains("rank 0 sent alloc of 1 pages"),
        "{err}"
    );
    // Never an answer again, even to the step it missed; the others go on.
    let again = step(&mut g, &mut e, 1, Request::Alloc { n: 1 }).unwrap_err();
    assert_eq!(again.kind, ErrorKind::Desync);
    assert_eq!(
        e.stats().owned_pages,
        1,
        "nothing ran for the rank out of step"
    );
    step(&mut g, &mut e, 2, Request::Stats).unwrap();
    step(&mut g, &mut e, 2, Request::Alloc { n: 1 }).unwrap();
    assert_eq!(
        g.figures().kept_steps,
        0,
        "the rank out of step holds no step"
    );
    // The same op with other arguments is out of step too.
    step(&mut g, &mut e, 0, Request::Evict { tokens: 4 }).unwrap();
    let err = step(&mut g, &mut e, 2, Request::Evict { tokens: 8 }).unwrap_err();
    assert!(
        err.message
            .contains("evict of 8 tokens where rank 0 sent evict of 4 tokens"),
        "{err}"
    );
}

#[test]
fn a_rank_far_ahead_waits_for_the_slowest() {
    let mut e = engine();
    let mut g = Groups::new();
    g.join(0, false, &join("g", 0, 2), PAGE).unwrap();
    g.join(1, false, &join("g", 1, 2), PAGE).unwrap();
    for _ in 0..LAG_STEPS {
        step(&mut g, &mut e, 0, Request::Stats).unwrap();
    }
    assert!(g.lagging(0));
    assert!(!g.lagging(1));
    let err = step(&mut g, &mut e, 0, Request::Stats).unwrap_err();
    assert_eq!(err.kind, ErrorKind::GroupLag);
    assert!(err.message.contains("rank 1 at step 0"), "{err}");
    step(&mut g, &mut e, 1, Request::Stats).unwrap();
    assert!(!g.lagging(0));
    step(&mut g, &mut e, 0, Request::Stats).unwrap();
    // The slowest rank leaving frees the leader at once.
    assert!(g.lagging(0));
    assert_eq!(g.leave(1), None);
    assert!(!g.lagging(0));
    assert_eq!(g.figures().kept_steps, 0);
}

#[test]
fn a_rank_that_joins_late_starts_at_step_zero() {
    let mut e = engine();
    let mut g = Groups::new();
    g.join(0, false, &join("g", 0, 2), PAGE).unwrap();
    let a = step(&mut g, &mut e, 0, Request::Alloc { n: 3 }).unwrap();
    assert_eq!(g.figures().kept_steps, 1, "kept for rank 1");
    assert_eq!(
        g.join(7, false, &join("g", 1, 2), PAGE),
        Ok(Reply::Joined {
            joined: 2,
            size: 2,
            board: None
        })
    );
    assert_eq!(step(&mut g, &mut e, 7, Request::Alloc { n: 3 }), Ok(a));
    assert_eq!(g.figures().kept_steps, 0);
}

#[test]
fn the_group_ends_with_its_last_connected_rank() {
    let mut g = Groups::new();
    g.join(0, false, &join("g", 0, 4), PAGE).unwrap();
    g.join(1, false, &join("g", 1, 4), PAGE).unwrap();
    assert_eq!(g.leave(9), None, "not a member");
    assert_eq!(g.leave(0), None);
    // Ranks 2 and 3 never came: they do not keep it alive.
    assert_eq!(g.leave(1), Some(GROUP_CLIENT));
    assert_eq!(g.figures(), GroupFigures::default());
    let err = g.join(2, false, &join("g", 2, 4), PAGE).unwrap_err();
    assert_eq!(err.kind, ErrorKind::GroupClosed);
    assert!(err.message.contains("finished"), "{err}");
    // Its id is free for the next group.
    g.join(3, false, &join("h", 0, 1), PAGE).unwrap();
    assert_eq!(g.leave(3), Some(GROUP_CLIENT));
}

#[test]
fn joins_that_disagree_or_come_too_late_change_nothing() {
    let mut g = Groups::new();
    g.join(0, false, &join("g", 0, 2), PAGE).unwrap();
    let refused =
        |g: &mut Groups, client: ClientId, alone: bool, j: Join, kind: ErrorKind, says: &str| {
            let before = g.figures();
            let err = g.join(client, alone, &j, PAGE).unwrap_err();
            assert_eq!(err.kind, kind, "{err}");
            assert!(err.message.contains(says), "{err}");
            assert_eq!(g.figures(), before);
            assert!(!g.is_member(client) || client == 0);
        };
    refused(
        &mut g,
        1,
        false,
        join("", 0, 1),
        ErrorKind::Malformed,
        "1..=256 bytes",
    );
    refused(
        &mut g,
        1,
        false,
        join(&"k".repeat(257), 0, 1),
        ErrorKind::Malformed,
        "not 257",
    );
    refused(
        &mut g,
        1,
        false,
        join("x", 0, 0),
        ErrorKind::GroupMismatch,
        "not 0",
    );
    refused(
        &mut g,
        1,
        false,
        join("x", 0, 65),
        ErrorKind::GroupMismatch,
        "not 65",
    );
    refused(
        &mut g,
        1,
        false,
        join("x", 2, 2),
        ErrorKind::GroupMismatch,
        "rank 2 is not below",
    );
    let mut paged = join("g", 1, 2);
    paged.page_size = 8;
    refused(
        &mut g,
        1,
        false,
        paged,
        ErrorKind::GroupMismatch,
        "pages of 8 tokens",
    );
    refused(
        &mut g,
        1,
        false,
        join("g", 1, 4),
        ErrorKind::GroupMismatch,
        "has 2 ranks; rank 1 says 4",
    );
    refused(
        &mut g,
        1,
        false,
        join("g", 0, 2),
        ErrorKind::GroupClosed,
        "joined already",
    );
    refused(
        &mut g,
        0,
        false,
        join("h", 0, 1),
        ErrorKind::GroupMismatch,
        "rank 0 of group \"g\" already",
    );
    refused(
        &mut g,
        1,
        true,
        join("g", 1, 2),
        ErrorKind::GroupMismatch,
        "before any cache operation",
    );
    g.join(1, false, &join("g", 1, 2), PAGE).unwrap();
    // A rank that left does not come back, even on a new connection.
    assert_eq!(g.leave(1), None);
    refused(
        &mut g,
        2,
        false,
        join("g", 1, 2),
        ErrorKind::GroupClosed,
        "left",
    );
}

#[test]
fn anchored_requests_are_refused_to_ranks() {
    let mut e = engine();
    let mut g = Groups::new();
    g.join(0, false, &join("g", 0, 1), PAGE).unwrap();
    let anchored = Request::MatchAt {
        anchor: crate::engine::Anchor {
            node: 0,
            generation: 0,
            version: 0,
            pages_into_node: 0,
        },
        matched_pages: 0,
        next_hash: None,
        lock: false,
    };
    let err = step(&mut g, &mut e, 0, anchored).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Malformed);
}

#[test]
fn only_what_a_scheduler_decides_by_is_stepped() {
    assert!(is_stepped(&Request::Stats));
    assert!(is_stepped(&Request::Reset));
    assert!(is_stepped(&Request::Namespaced {
        ns: "a".into(),
        request: Box::new(Request::Match {
            tokens: vec![],
            lock: false
        })
    }));
    assert!(!is_stepped(&Request::Validate));
    assert!(!is_stepped(&Request::Bind { pool: "a=b".into() }));
    assert!(!is_stepped(&Request::Namespace { name: "a".into() }));
    assert!(!is_stepped(&Request::Join(join("g", 0, 1))));
}

#[test]
fn the_bytes_kept_go_with_the_steps_every_rank_has_taken() {
    let mut e = engine();
    let mut g = Groups::new();
    g.join(0, false, &join("g", 0, 2), PAGE).unwrap();
    g.join(1, false, &join("g", 1, 2), PAGE).unwrap();
    let kept = |g: &Groups| g.groups[0].as_ref().unwrap().bytes;
    let first = Request::Match {
        tokens: vec![1; 64],
        lock: false,
    };
    step(&mut g, &mut e, 0, first.clone()).unwrap();
    // 128 bytes a step, and 4 a word of its request and its answer (64
    // tokens; no pages matched).
    let one = kept(&g);
    assert_eq!(one, 128 + 4 * 64);
    step(&mut g, &mut e, 0, Request::Stats).unwrap();
    let two = kept(&g);
    assert_eq!(two, one + 128);
    step(&mut g, &mut e, 1, first).unwrap();
    assert_eq!(kept(&g), two - one, "the first step is gone");
    step(&mut g, &mut e, 1, Request::Stats).unwrap();
    assert_eq!(kept(&g), 0);
}

#[test]
fn a_rank_held_back_is_told_which_rank_is_slowest() {
    let mut e = engine();
    let mut g = Groups::new();
    for rank in 0..3 {
        g.join(rank, false, &join("g", rank, 3), PAGE).unwrap();
    }
    for _ in 0..LAG_STEPS {
        step(&mut g, &mut e, 0, Request::Stats).unwrap();
    }
    // Rank 1 takes a step, rank 2 none: rank 2 is the slowest.
    step(&mut g, &mut e, 1, Request::Stats).unwrap();
    let err = step(&mut g, &mut e, 0, Request::Stats).unwrap_err();
    assert_eq!(err.kind, ErrorKind::GroupLag);
    assert!(err.message.contains("rank 2 at step 0"), "{err}");
}

#[test]
fn a_rank_alone_leads_every_step_in_turn() {
    let mut e = engine();
    let mut g = Groups::new();
    g.join(4, false, &join("solo", 0, 1), PAGE).unwrap();
    for n in 0..3 {
        let (answer, led) = g
            .step_leading(4, Request::Stats, |c, r| apply(&mut e, c, r))
            .unwrap();
        assert!(answer.is_ok());
        assert_eq!(led, Some(n), "step {n}");
        assert_eq!(g.next_step(0, 0), Some(n + 1));
    }
    assert_eq!(g.figures().kept_steps, 0, "nobody else to keep it for");
}

#[test]
fn a_finished_group_stays_finished_after_others_finish() {
    let mut g = Groups::new();
    for (client, key) in [(0, "a"), (1, "b"), (2, "c")] {
        g.join(client, false, &join(key, 0, 2), PAGE).unwrap();
        assert!(g.leave(client).is_some(), "{key} finished");
    }
    for key in ["a", "b", "c"] {
        let err = g.join(9, false, &join(key, 1, 2), PAGE).unwrap_err();
        assert_eq!(err.kind, ErrorKind::GroupClosed, "{key}: {err}");
    }
}

#[test]
fn the_group_owns_its_pages_even_against_the_client_of_its_index() {
    // Client 0 is rank 0 of group 0: the group's id must not be 0 too,
    // or the rank could free the group's pages as its own.
    let mut e = engine();
    let mut g = Groups::new();
    g.join(0, false, &join("g", 0, 1), PAGE).unwrap();
    let Ok(Reply::Pages(pages)) = step(&mut g, &mut e, 0, Request::Alloc { n: 2 }) else {
        panic!("an alloc answers pages")
    };
    assert!(e.free(0, &pages).is_err(), "the group's, not client 0's");
    assert!(e.free(Groups::group_client(0), &pages).is_ok());
}

#[test]
fn membership_and_position_name_the_group_and_the_rank() {
    let mut g = Groups::new();
    assert!(g.is_empty());
    g.join(10, false, &join("a", 0, 1), PAGE).unwrap();
    g.join(11, false, &join("b", 2, 3), PAGE).unwrap();
    assert!(!g.is_empty());
    assert!(g.is_member(11));
    assert!(!g.is_member(12));
    assert_eq!(g.position(10), Some((0, 0)));
    assert_eq!(g.position(11), Some((1, 2)));
    assert_eq!(g.position(12), None);
    assert_eq!(g.leave(10), Some(GROUP_CLIENT));
    assert_eq!(g.leave(11), Some(GROUP_CLIENT | 1));
    assert!(g.is_empty(), "every rank left");
}

#[test]
fn a_group_key_of_exactly_the_longest_length_is_taken() {
    let mut g = Groups::new();
    let key = "k".repeat(MAX_GROUP_KEY);
    assert!(g.join(0, false, &join(&key, 0, 1), PAGE).is_ok());
}

#[test]
fn kept_steps_and_their_requests_are_those_a_rank_has_yet_to_take() {
    let mut e = engine();
    let mut g = Groups::new();
    g.join(0, false, &join("g", 0, 2), PAGE).unwrap();
    g.join(1, false, &join("g", 1, 2), PAGE).unwrap();
    let second = Request::Alloc { n: 1 };
    step(&mut g, &mut e, 0, Request::Stats).unwrap();
    step(&mut g, &mut e, 0, second.clone()).unwrap();
    assert_eq!(g.kept(0), 2);
    assert_eq!(g.kept(1), 0, "no such group");
    assert_eq!(g.kept_request(0, 0), Some(&Request::Stats));
    assert_eq!(g.kept_request(0, 1), Some(&second));
    assert_eq!(g.kept_request(0, 2), None, "not made yet");
    step(&mut g, &mut e, 1, Request::Stats).unwrap();
    assert_eq!(g.kept(0), 1);
    assert_eq!(g.kept_request(0, 0), None, "taken by every rank");
    assert_eq!(g.kept_request(0, 1), Some(&second));
}

#[test]
fn step_leading_names_the_step_only_when_the_rank_carried_one_out() {
    let mut e = engine();
    let mut g = Groups::new();
    g.join(0, false, &join("g", 0, 2), PAGE).unwrap();
    g.join(1, false, &join("g", 1, 2), PAGE).unwrap();
    let mut lead = |g: &mut Groups, client: ClientId, request: Request| {
        g.step_leading(client, request, |c, r| apply(&mut e, c, r))
            .expect("a member")
    };
    let (a, led) = lead(&mut g, 0, Request::Stats);
    assert!(a.is_ok());
    assert_eq!(led, Some(0));
    assert_eq!(lead(&mut g, 0, Request::Alloc { n: 1 }).1, Some(1));
    // Following a step is not leading it.
    assert_eq!(lead(&mut g, 1, Request::Stats).1, None);
    assert_eq!(lead(&mut g, 1, Request::Alloc { n: 1 }).1, None);
    // Rank 1 leads step 2 once both have taken steps 0 and 1.
    assert_eq!(lead(&mut g, 1, Request::Evict { tokens: 0 }).1, Some(2));
    // A refused request at the head of the steps leads nothing.
    let anchored = Request::MatchAt {
        anchor: crate::engine::Anchor {
            node: 0,
            generation: 0,
            version: 0,
            pages_into_node: 0,
        },
        matched_pages: 0,
        next_hash: None,
        lock: false,
    };
    let (refused, led) = lead(&mut g, 1, anchored);
    assert!(refused.is_err());
    assert_eq!(led, None);
    assert_eq!(
        g.step_leading(9, Request::Stats, |_, _| Ok(Reply::Done)),
        None
    );
}

#[test]
fn catching_up_off_the_board_takes_the_steps_below_the_cursor_and_no_more() {
    let mut e = engine();
    let mut g = Groups::new();
    for rank in 0..3 {
        g.join(rank, false, &join("g", rank, 3), PAGE).unwrap();
    }
    let script = [
        Request::Stats,
        Request::Alloc { n: 1 },
        Request::Evict { tokens: 0 },
        Request::Alloc { n: 2 },
    ];
    for r in &script {
        step(&mut g, &mut e, 0, r.clone()).unwrap();
    }
    assert_eq!(g.kept(0), 4);
    // Rank 1 has taken steps 0 and 1 off the board: rank 2 still needs
    // every step.
    g.catch_up(0, 1, 2);
    assert_eq!(g.next_step(0, 1), Some(2));
    assert_eq!(g.kept(0), 4);
    // A cursor past the steps made stops at the last one; steps 0 and 1
    // are now every rank's.
    g.catch_up(0, 2, 99);
    assert_eq!(g.next_step(0, 2), Some(4));
    assert_eq!(g.kept(0), 2);
    // A cursor behind the rank changes nothing.
    g.catch_up(0, 1, 1);
    assert_eq!(g.next_step(0, 1), Some(2));
    assert_eq!(g.kept(0), 2);
    // From past the forgotten steps: step 2 goes, step 3 waits for rank 1.
    g.catch_up(0, 1, 3);
    assert_eq!(g.next_step(0, 1), Some(3));
    assert_eq!(g.kept(0), 1);
    assert_eq!(g.kept_request(0, 3), Some(&script[3]));
    // Rank 1 takes step 3 as a step: the answer rank 0 got.
    assert!(step(&mut g, &mut e, 1, script[3].clone()).is_ok());
    assert_eq!(g.kept(0), 0);
    // No such group or rank: nothing happens.
    g.catch_up(5, 0, 9);
    g.catch_up(0, 7, 9);
    assert_eq!(g.next_step(0, 0), Some(4));
}

#[test]
fn only_joined_ranks_catch_up() {
    let mut e = engine();
    let mut g = Groups::new();
    g.join(0, false, &join("g", 0, 3), PAGE).unwrap();
    g.join(1, false, &join("g", 1, 3), PAGE).unwrap();
    step(&mut g, &mut e, 0, Request::Stats).unwrap();
    // Rank 1 out of step, rank 2 not joined: neither moves.
    assert!(step(&mut g, &mut e, 1, Request::Alloc { n: 1 }).is_err());
    g.catch_up(0, 1, 1);
    g.catch_up(0, 2, 1);
    assert_eq!(g.next_step(0, 1), Some(0));
    assert_eq!(g.next_step(0, 2), Some(0));
    assert_eq!(g.kept(0), 1, "rank 2 has yet to take step 0");
}

#[test]
fn catch_up_all_reads_each_ranks_cursor() {
    let mut e = engine();
    let mut g = Groups::new();
    for rank in 0..3 {
        g.join(rank, false, &join("g", rank, 3), PAGE).unwrap();
    }
    for _ in 0..3 {
        step(&mut g, &mut e, 0, Request::Stats).unwrap();
    }
    // Each rank has taken the steps below its own number.
    g.catch_up_all(0, u64::from);
    assert_eq!(g.next_step(0, 1), Some(1));
    assert_eq!(g.next_step(0, 2), Some(2));
    assert_eq!(g.kept(0), 2, "step 0 taken by all");
    g.catch_up_all(3, |_| 9);
}

#[test]
fn kept_bytes_count_each_request_and_answer_by_its_words() {
    // What `LAG_BYTES` measures: the tokens and pages a step carries.
    let t = |n: u32| (0..n).collect::<Vec<u32>>();
    let insert = Request::Insert {
        tokens: t(8),
        pages: t(2),
        lock: false,
    };
    let match8 = Request::Match {
        tokens: t(8),
        lock: false,
    };
    for r in [
        insert.clone(),
        Request::InsertWith {
            tokens: t(8),
            pages: t(2),
            lock: false,
            mamba_state: None,
            swa_evicted: 0,
        },
        Request::InsertPaired {
            tokens: t(8),
            pages: t(2),
            lock: false,
            mamba_state: None,
            swa_evicted: 0,
            tail: 0,
        },
        Request::SessionCommit {
            session: "s".into(),
            tokens: t(8),
            pages: t(2),
        },
    ] {
        assert_eq!(payload_words(&r), 10, "{r:?}");
    }
    for r in [
        match8.clone(),
        Request::MatchWith {
            tokens: t(8),
            lock: false,
        },
        Request::Walk { tokens: t(8) },
    ] {
        assert_eq!(payload_words(&r), 8, "{r:?}");
    }
    for r in [
        Request::Free { pages: t(3) },
        Request::FreeSwa { pages: t(3) },
        Request::SwaPages { pages: t(3) },
        Request::LockPaired {
            handle: 1,
            pages: t(3),
        },
        Request::FreeStates { states: t(3) },
    ] {
        assert_eq!(payload_words(&r), 3, "{r:?}");
    }
    // A namespace's name in words, plus one, around what it wraps.
    let namespaced = Request::Namespaced {
        ns: "abcdefgh".into(),
        request: Box::new(match8.clone()),
    };
    assert_eq!(payload_words(&namespaced), 2 + 1 + 8);
    assert_eq!(payload_words(&Request::Counted(Box::new(match8))), 8);
    let hinted = Request::Hinted {
        hints: Default::default(),
        request: Box::new(insert),
    };
    assert_eq!(payload_words(&hinted), 4 + 10);
    assert_eq!(payload_words(&Request::Stats), 0);
    // An error's message in words, plus one.
    let refused = Err(Rejection::new(ErrorKind::Malformed, "123456789"));
    assert_eq!(answer_words(&refused), 9 / 4 + 1);
    assert_eq!(answer_words(&Ok(Reply::Pages(t(3)))), 3);
    for r in [
        Reply::Pages(t(3)),
        Reply::SwaPages(t(3)),
        Reply::States(t(3)),
    ] {
        assert_eq!(reply_words(&r), 3, "{r:?}");
    }
    let matched = Reply::Matched {
        len: 8,
        pages: t(2),
        handle: None,
    };
    assert_eq!(reply_words(&matched), 2);
    let with = Reply::MatchedWith {
        len: 8,
        pages: t(2),
        handle: None,
        full_len: 8,
        mamba_state: None,
    };
    assert_eq!(reply_words(&with), 2);
    let paired = Reply::PagesPaired {
        pages: t(2),
        swa_pages: t(3),
    };
    assert_eq!(reply_words(&paired), 5);
    let inserted = Reply::InsertedPaired {
        cached: 0,
        len: 8,
        handle: None,
        locked: false,
        mamba_exist: false,
        pages: t(2),
        swa_pages: t(3),
    };
    assert_eq!(reply_words(&inserted), 5);
    let locked = Reply::LockedPaired {
        lock: 1,
        delta: 0,
        swa_pages: t(3),
    };
    assert_eq!(reply_words(&locked), 3);
    // The free counts: six words.
    let counted = Reply::Counted {
        reply: Box::new(Reply::Pages(t(3))),
        free: Default::default(),
    };
    assert_eq!(reply_words(&counted), 3 + 6);
    assert_eq!(reply_words(&Reply::Done), 0);
}
