//! Unit tests of the out-of-step messages (`desync`): what differs is
//! named, and a message fits a reply window whatever the names.

use super::*;
use crate::engine::{Config, Engine};
use crate::op::apply;

fn m(tokens: Vec<u32>) -> Request {
    Request::Match {
        tokens,
        lock: false,
    }
}

#[test]
fn the_first_difference_is_named() {
    let led: Vec<u32> = (0..16).collect();
    let mut ours = led.clone();
    ours[9] = 900;
    let said = |a: &Request, b: &Request| first_difference(a, b, 0);
    assert_eq!(
        said(&m(ours), &m(led.clone())),
        "the keys first differ at token 9 (from 0): 900 here, 9 at rank 0"
    );
    assert_eq!(
        said(&m(led[..12].to_vec()), &m(led.clone())),
        "the keys agree on their first 12 tokens, then one ends: 12 tokens here, 16 at rank 0"
    );
    let insert = |pages: Vec<u32>, lock| Request::Insert {
        tokens: led.clone(),
        pages,
        lock,
    };
    assert_eq!(
        said(
            &insert(vec![1, 2, 3, 4], false),
            &insert(vec![1, 2, 7, 4], false)
        ),
        "the pages first differ at page 2 (from 0): 3 here, 7 at rank 0"
    );
    assert_eq!(
        said(&insert(vec![1], true), &insert(vec![1], false)),
        "the same key, but this call locks and rank 0's does not lock"
    );
    let ns = |name: &str, r: Request| Request::Namespaced {
        ns: name.to_owned(),
        request: Box::new(r),
    };
    assert_eq!(
        said(&ns("a", m(vec![1])), &m(vec![1])),
        "the namespaces differ: \"a\" here, none at rank 0"
    );
    assert_eq!(
        said(&ns("a", m(vec![1, 5])), &ns("a", m(vec![1, 6]))),
        "the keys first differ at token 1 (from 0): 5 here, 6 at rank 0"
    );
    assert_eq!(
        said(&Request::Stats, &Request::Alloc { n: 1 }),
        "another op: stats here, alloc at rank 0"
    );
    let with = Request::MatchWith {
        tokens: vec![1],
        lock: false,
    };
    assert_eq!(
        said(&with, &m(vec![1])),
        "another form of match than rank 0's"
    );
    assert_eq!(
        said(&Request::Evict { tokens: 8 }, &Request::Evict { tokens: 4 }),
        "the same op as rank 0's, other arguments"
    );
}

/// The longest names there are (group key, session id, namespace) and
/// the largest numbers: the message still fits a reply window, what
/// differs whole.
#[test]
fn a_desync_fits_a_reply_window_whatever_the_names() {
    let mut e = Engine::new(Config {
        page_size: 4,
        capacity: 64,
    })
    .unwrap();
    let mut g = Groups::new();
    let key = "k".repeat(MAX_GROUP_KEY);
    for rank in [0, 1] {
        let join = Join {
            group: key.clone(),
            rank,
            size: 2,
            page_size: 4,
        };
        g.join(rank, false, &join, 4).unwrap();
    }
    let commit = |last: u32| Request::Namespaced {
        ns: "n".repeat(256),
        request: Box::new(Request::SessionCommit {
            session: "s".repeat(crate::op::MAX_SESSION_ID),
            tokens: vec![u32::MAX - 1, u32::MAX, u32::MAX, u32::MAX, last],
            pages: vec![u32::MAX; 1],
        }),
    };
    let mut run = |rank, r| {
        g.step(rank, r, |c, r| apply(&mut e, c, r))
            .expect("a member")
    };
    let _ = run(0, commit(7));
    let err = run(1, commit(u32::MAX)).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Desync);
    assert!(
        err.message.len() <= crate::wire::MIN_REPLY_WINDOW,
        "{}",
        err.message.len()
    );
    assert!(
        err.message.contains(&format!(
            "the keys first differ at token 4 (from 0): {} here, 7 at rank 0",
            u32::MAX
        )),
        "{err}"
    );
    assert!(err.message.ends_with("..."), "{err}");
}

#[test]
fn differing_insert_hints_are_named() {
    use crate::engine::InsertHints;
    let insert = Request::Insert {
        tokens: vec![1, 2],
        pages: vec![3, 4],
        lock: false,
    };
    let hinted = |priority, inserted_len| Request::Hinted {
        hints: InsertHints {
            priority,
            inserted_len,
        },
        request: Box::new(insert.clone()),
    };
    assert_eq!(
        first_difference(&hinted(2, 0), &hinted(1, 0), 3),
        "the insert hints differ: priority 2, inserted_len 0 here, priority 1, inserted_len 0 at rank 3"
    );
    assert_eq!(
        first_difference(&insert, &hinted(0, 4), 0),
        "the insert hints differ: priority 0, inserted_len 0 here, priority 0, inserted_len 4 at rank 0"
    );
    assert_eq!(
        describe(&hinted(-1, 2)),
        "insert of 2 tokens [1, 2] with 2 pages with priority -1 and inserted_len 2"
    );
}

/// A name clipped inside a two-byte character ends before it (byte 48 of
/// the quoted name falls inside an `é`), then says it was cut; a name
/// that fits, exactly too, is quoted whole.
#[test]
fn a_clipped_name_ends_on_a_whole_character() {
    let name = "é".repeat(40);
    let quoted = format!("{name:?}");
    let c = clipped(&name);
    let body = c.strip_suffix("...").expect("a cut name says so");
    assert_eq!(body.len(), 47, "{c}");
    assert!(quoted.starts_with(body));
    let exact = "a".repeat(46);
    assert_eq!(clipped(&exact), format!("{exact:?}"));
    assert_eq!(clipped("short"), "\"short\"");
}

/// A message of exactly a reply window's room goes whole; a longer one is
/// cut to the room, before a character the room would split, and says so.
#[test]
fn a_fitted_message_fills_the_window_and_no_more() {
    let room = crate::wire::MIN_REPLY_WINDOW;
    let exact = "x".repeat(room);
    assert_eq!(fitted(exact.clone()), exact);
    // `é` starts at even bytes: the cut at room - 3 (odd) splits one.
    let long = "é".repeat(room);
    let f = fitted(long.clone());
    assert_eq!(f.len(), room - 1, "{}", f.len());
    let body = f.strip_suffix("...").expect("a cut message says so");
    assert!(long.starts_with(body));
}

/// The key of a `walk` and the pages of a `free` (and the other page-list
/// requests) are compared, not only their op.
#[test]
fn walks_and_frees_name_their_first_difference() {
    let led: Vec<u32> = (0..8).collect();
    let mut ours = led.clone();
    ours[5] = 50;
    assert_eq!(
        first_difference(
            &Request::Walk {
                tokens: ours.clone()
            },
            &Request::Walk {
                tokens: led.clone()
            },
            1
        ),
        "the keys first differ at token 5 (from 0): 50 here, 5 at rank 1"
    );
    for (a, b) in [
        (
            Request::Free {
                pages: ours.clone(),
            },
            Request::Free { pages: led.clone() },
        ),
        (
            Request::FreeStates {
                states: ours.clone(),
            },
            Request::FreeStates {
                states: led.clone(),
            },
        ),
    ] {
        assert_eq!(
            first_difference(&a, &b, 1),
            "the pages first differ at page 5 (from 0): 50 here, 5 at rank 1",
            "{}",
            a.name()
        );
    }
}
