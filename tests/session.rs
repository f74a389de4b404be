//! Streaming sessions: per-turn commits, lock handoff, release without bulk
//! eviction, and the invariants of issue 5, each a test.

use std::time::{Duration, Instant};

use radixd::engine::{Engine, SessionError};

mod common;

use common::{engine, ok, A, B};

fn resident(e: &Engine, s: &str) -> u64 {
    e.session_status(s).expect("live session").resident_tokens
}

fn peek(e: &Engine, tokens: &[u32]) -> usize {
    e.peek(tokens, &mut Vec::new())
}

/// Commits `tokens`, allocating pages only for the part not yet cached (as a
/// scheduler that matched first would) and reusing the cached ones.
fn commit(e: &mut Engine, client: u32, s: &str, tokens: &[u32]) -> (usize, usize) {
    let mut pages = Vec::new();
    e.peek(tokens, &mut pages);
    let whole = tokens.len() / e.page_size() as usize;
    let fresh = e
        .alloc(client, (whole - pages.len()) as u64)
        .expect("alloc");
    pages.extend(fresh);
    let r = e.session_commit(client, s, tokens, &pages).expect("commit");
    ok(e);
    (r.cached, r.len)
}

#[test]
fn turns_commit_incrementally_and_stay_locked() {
    let mut e = engine(2, 64);
    let turn1: Vec<u32> = (0..10).collect();
    let turn2: Vec<u32> = (0..16).collect();
    assert_eq!(commit(&mut e, A, "chat", &turn1), (0, 10));
    assert_eq!(commit(&mut e, A, "chat", &turn2), (10, 16));
    assert_eq!(resident(&e, "chat"), 16);
    let s = e.stats();
    assert_eq!((s.protected_tokens, s.evictable_tokens), (16, 0));
    assert_eq!(e.evict(1_000), 0, "a live session is never evicted");
    assert_eq!(e.sessions(), 1);
}

#[test]
fn resident_tokens_never_decrease_across_commits() {
    let mut e = engine(1, 64);
    let mut conversation = Vec::new();
    let mut last = 0;
    for turn in 0..10u32 {
        conversation.extend((0..5).map(|i| turn * 10 + i));
        commit(&mut e, A, "s", &conversation);
        // Pressure from outside the session cannot shrink it.
        e.evict(1_000);
        let now = resident(&e, "s");
        assert!(now >= last, "resident went from {last} to {now}");
        last = now;
    }
    assert_eq!(last, 50);
}

#[test]
fn retrying_a_commit_is_idempotent() {
    let mut e = engine(2, 32);
    let tokens: Vec<u32> = (0..12).collect();
    let pages = e.alloc(A, 6).unwrap();
    e.session_commit(A, "s", &tokens, &pages).unwrap();
    let (stats, status) = (e.stats(), resident(&e, "s"));
    let r = e.session_commit(A, "s", &tokens, &pages).unwrap();
    assert_eq!((r.cached, r.len), (12, 12));
    assert_eq!(e.stats(), stats);
    assert_eq!(resident(&e, "s"), status);
    ok(&e);
}

#[test]
fn release_drops_only_the_lock() {
    let mut e = engine(2, 32);
    let tokens: Vec<u32> = (0..12).collect();
    commit(&mut e, A, "s", &tokens);
    let free = e.stats().free_pages;
    e.session_release(A, "s").unwrap();
    ok(&e);
    // Invariant 1: what the conversation matches now depends on the tree
    // alone, and release itself freed nothing.
    assert_eq!(peek(&e, &tokens), 12);
    assert_eq!(e.stats().free_pages, free);
    assert_eq!(e.stats().evictable_tokens, 12);
    assert_eq!(
        e.session_status("s"),
        Err(SessionError::Unknown("s".into()))
    );
    assert_eq!(
        e.session_release(A, "s"),
        Err(SessionError::Unknown("s".into()))
    );
}

#[test]
fn a_released_session_is_shaved_page_by_page() {
    // Invariant 6: 50,000 tokens at P=16, released; the pool fills so that
    // 64 tokens must go: exactly 4 pages, from the session's tail.
    let mut e = engine(16, 3125 + 100);
    let tokens: Vec<u32> = (0..50_000).collect();
    commit(&mut e, A, "long", &tokens);
    assert_eq!(resident(&e, "long"), 50_000);
    e.session_release(A, "long").unwrap();
    let free = e.stats().free_pages;
    e.alloc(B, free + 4).unwrap();
    ok(&e);
    assert_eq!(e.stats().evicted_pages, 4);
    assert_eq!(peek(&e, &tokens), 49_936);
}

#[test]
fn an_edited_history_moves_the_session_to_its_new_branch() {
    let mut e = engine(1, 32);
    commit(&mut e, A, "s", &[1, 2, 3, 4, 5, 6]);
    commit(&mut e, A, "s", &[1, 2, 3, 9, 9]);
    assert_eq!(resident(&e, "s"), 5);
    // The old branch [4,5,6] is unlocked; the shared [1,2,3] and the new
    // [9,9] stay locked.
    let s = e.stats();
    assert_eq!((s.protected_tokens, s.evictable_tokens), (5, 3));
    assert_eq!(e.evict(100), 3);
    assert_eq!(peek(&e, &[1, 2, 3, 4]), 3);
    ok(&e);
}

#[test]
fn sessions_belong_to_their_client() {
    let mut e = engine(1, 32);
    commit(&mut e, A, "mine", &[1, 2, 3]);
    let pages = e.alloc(B, 3).unwrap();
    let before = e.stats();
    assert_eq!(
        e.session_commit(B, "mine", &[1, 2, 3], &pages).map(drop),
        Err(SessionError::NotOwned("mine".into()))
    );
    assert_eq!(
        e.session_release(B, "mine"),
        Err(SessionError::NotOwned("mine".into()))
    );
    assert_eq!(e.stats(), before);
    // A commit with bad pages changes nothing and opens no session.
    assert!(e
        .session_commit(B, "other", &[7, 7], &[pages[0], pages[0]])
        .is_err());
    assert_eq!((e.sessions(), e.stats()), (1, before));
    ok(&e);
}

#[test]
fn every_session_lock_is_dropped_exactly_once() {
    // Invariant 5: handoff, release, TTL and client death each drop the
    // lock once; validate() checks every lock count along the way.
    let mut e = engine(1, 64);
    commit(&mut e, A, "handoff", &[1, 2]);
    commit(&mut e, A, "handoff", &[1, 2, 3]);
    commit(&mut e, A, "released", &[4, 5]);
    commit(&mut e, A, "idle", &[6, 7]);
    commit(&mut e, B, "dead", &[8, 9]);
    e.session_release(A, "released").unwrap();
    ok(&e);
    assert_eq!(
        e.expire_sessions(Duration::from_secs(60), Instant::now()),
        0
    );
    let later = Instant::now() + Duration::from_secs(120);
    assert_eq!(e.expire_sessions(Duration::from_secs(60), later), 3);
    ok(&e);
    commit(&mut e, B, "dead", &[8, 9]);
    e.release_client(B);
    ok(&e);
    assert_eq!(e.sessions(), 0);
    assert_eq!(e.stats().protected_tokens, 0);
}

#[test]
fn requests_outside_sessions_behave_as_before() {
    // Invariant 4: the same non-session requests give the same answers with
    // or without an unrelated session alongside (room for both).
    let run = |with_session: bool| {
        let mut e = engine(1, 64);
        if with_session {
            commit(&mut e, B, "side", &[100, 101, 102]);
        }
        let mut answers = Vec::new();
        for key in [[1u32, 2, 3, 4], [1, 2, 5, 6], [7, 8, 9, 10]] {
            let pages = e.alloc(A, 4).unwrap();
            let r = e.insert(A, &key, &pages, false).unwrap();
            answers.push((r.cached, r.len, pages.len()));
        }
        answers.push((
            e.evict(3) as usize,
            peek(&e, &[1, 2, 3, 4]),
            peek(&e, &[7, 8, 9, 10]),
        ));
        ok(&e);
        answers
    };
    assert_eq!(run(false), run(true));
}
