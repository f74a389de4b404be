//! Unit tests of the hybrid step's requests on the wire (`AllocPaired`,
//! `LockPaired`, `InsertPaired`, `AllocStates`, `FreeStates` and counted
//! requests): they round trip, are stepped as their calls are, their
//! digests tell them from every other request, their answers fit the room
//! asked for, and malformed ones are refused. Apart from `tests` because
//! they are one feature's.

use super::record::{opcode, FLAG_COUNTED, FREE_BYTES};
use super::tests::requests;
use super::*;
use crate::engine::FreeCounts;

fn counted(r: Request) -> Request {
    Request::Counted(Box::new(r))
}

fn step_requests() -> Vec<Request> {
    vec![
        Request::AllocPaired { n: 5 },
        Request::LockPaired {
            handle: 1 << 40 | 3,
            pages: vec![1, 2, 3],
        },
        Request::LockPaired {
            handle: 7,
            pages: vec![],
        },
        Request::InsertPaired {
            tokens: vec![1, 2, 3, 4],
            pages: vec![9, 10],
            lock: true,
            mamba_state: Some(u32::MAX),
            swa_evicted: 1 << 40,
            tail: 3,
        },
        Request::InsertPaired {
            tokens: vec![1, 2, 3, 4],
            pages: vec![9, 10],
            lock: false,
            mamba_state: None,
            swa_evicted: 0,
            tail: 0,
        },
        Request::AllocStates { n: 2 },
        Request::FreeStates { states: vec![4, 5] },
        Request::FreeStates { states: vec![] },
        Request::EvictLeaf,
        counted(Request::EvictLeaf),
        counted(Request::Alloc { n: 3 }),
        counted(Request::Free { pages: vec![1, 2] }),
        counted(Request::EvictComponents {
            tokens: 1,
            swa_tokens: 2,
            mamba_states: 3,
        }),
        counted(Request::Stats),
        counted(Request::AllocPaired { n: 5 }),
        counted(Request::FreeStates { states: vec![4, 5] }),
        counted(Request::Namespaced {
            ns: "lora-7".into(),
            request: Box::new(Request::InsertPaired {
                tokens: vec![1, 2, 3, 4],
                pages: vec![9, 10],
                lock: true,
                mamba_state: None,
                swa_evicted: 2,
                tail: 1,
            }),
        }),
        Request::Namespaced {
            ns: "lora-7".into(),
            request: Box::new(Request::InsertPaired {
                tokens: vec![1, 2, 3, 4],
                pages: vec![9, 10],
                lock: true,
                mamba_state: None,
                swa_evicted: 2,
                tail: 1,
            }),
        },
    ]
}

#[test]
fn step_requests_round_trip_and_are_stepped_as_their_calls() {
    let mut mem = vec![0u64; 512];
    let base = std::ptr::NonNull::new(mem.as_mut_ptr().cast::<u8>()).unwrap();
    // SAFETY: `mem` outlives `scratch` and is touched only through it.
    let scratch = unsafe { Scratch::from_raw(base, 4096) };
    for (i, request) in step_requests().into_iter().enumerate() {
        assert_eq!(
            Call::of(&request).is_stepped(),
            crate::group::is_stepped(&request),
            "{request:?}"
        );
        assert!(crate::group::is_stepped(&request), "{request:?}");
        let e = encode_request(&request, 2, 64);
        assert_eq!(e.payload().len(), e.record.payload_len as usize);
        assert_eq!(
            decode_request(&e.record, e.payload().as_slice(), &mut Spare::default()),
            Ok(request.clone())
        );
        let at = (i * 41 % 100) as u32;
        scratch.write_bytes(u64::from(at), &e.payload()).unwrap();
        let window = ScratchWindow::new(&scratch, at, e.record.payload_len).unwrap();
        assert_eq!(
            decode_request(&e.record, &window, &mut Spare::default()),
            Ok(request)
        );
    }
}

#[test]
fn digests_tell_step_requests_from_every_other() {
    let all: Vec<Request> = requests().into_iter().chain(step_requests()).collect();
    let digests: Vec<[u64; 2]> = all
        .iter()
        .map(|r| digest(&encode_request(r, 4, 64)))
        .collect();
    for (i, a) in digests.iter().enumerate() {
        for (j, b) in digests.iter().enumerate().skip(i + 1) {
            assert_ne!(a, b, "{:?} and {:?}", all[i], all[j]);
        }
    }
    // A counted request is another step than the request alone, and the
    // tail, the state and the pages to pair each change the digest.
    let d = |r: &Request| digest(&encode_request(r, 4, 64));
    let insert = |tail, mamba_state| Request::InsertPaired {
        tokens: vec![1, 2, 3, 4],
        pages: vec![9],
        lock: true,
        mamba_state,
        swa_evicted: 0,
        tail,
    };
    let base = insert(2, Some(1));
    for other in [insert(1, Some(1)), insert(2, Some(2)), insert(2, None)] {
        assert_ne!(d(&base), d(&other), "{other:?}");
    }
    assert_ne!(d(&base), d(&counted(base.clone())));
    let lock = |pages: Vec<u32>| Request::LockPaired { handle: 5, pages };
    assert_ne!(d(&lock(vec![1])), d(&lock(vec![2])));
    assert_ne!(d(&lock(vec![])), d(&Request::Lock { handle: 5 }));
    assert_eq!(d(&base), d(&base.clone()));
}

fn free() -> FreeCounts {
    FreeCounts {
        pages: 1 << 33,
        swa_pages: 7,
        mamba_states: 0,
    }
}

fn counted_reply(r: Reply) -> Reply {
    Reply::Counted {
        reply: Box::new(r),
        free: free(),
    }
}

fn step_replies() -> Vec<Reply> {
    let paired = Reply::InsertedPaired {
        cached: 2,
        len: 8,
        handle: Some(9 << 32 | 1 << 31 | 4),
        locked: true,
        mamba_exist: true,
        pages: vec![1, 2, 3, 4],
        swa_pages: vec![7, u32::MAX],
    };
    vec![
        Reply::PagesPaired {
            pages: vec![3, 4],
            swa_pages: vec![8, 9],
        },
        Reply::PagesPaired {
            pages: vec![3, 4],
            swa_pages: vec![],
        },
        Reply::PagesPaired {
            pages: vec![],
            swa_pages: vec![],
        },
        Reply::LockedPaired {
            lock: 1 << 31 | 5,
            delta: -12,
            swa_pages: vec![u32::MAX, 3],
        },
        Reply::LockedPaired {
            lock: 5,
            delta: 0,
            swa_pages: vec![],
        },
        paired.clone(),
        Reply::InsertedPaired {
            cached: 0,
            len: 0,
            handle: None,
            locked: false,
            mamba_exist: false,
            pages: vec![],
            swa_pages: vec![],
        },
        Reply::States(vec![0, u32::MAX]),
        Reply::States(vec![]),
        Reply::EvictedLeaf {
            handle: Some(1 << 40 | 3),
            tokens: 32,
        },
        Reply::EvictedLeaf {
            handle: None,
            tokens: 0,
        },
        counted_reply(Reply::EvictedLeaf {
            handle: Some(7),
            tokens: 4,
        }),
        counted_reply(Reply::Done),
        counted_reply(Reply::Pages(vec![1])),
        counted_reply(Reply::State { state: 3 }),
        counted_reply(paired),
        counted_reply(Reply::Inserted {
            cached: 1,
            len: 2,
            handle: Some(9),
            locked: true,
        }),
        counted_reply(Reply::EvictedComponents {
            tokens: 1,
            swa_tokens: 2,
            mamba_states: 3,
        }),
    ]
}

#[test]
fn step_replies_round_trip_and_counted_ones_leave_the_record() {
    let mut payload = Vec::new();
    for reply in step_replies() {
        let w = encode_reply(42, &Ok(reply.clone()), usize::MAX, &mut payload);
        let counted = matches!(reply, Reply::Counted { .. });
        assert_eq!(w.flags & FLAG_COUNTED != 0, counted, "{reply:?}");
        if counted {
            // The counts never fit the record: the window holds them last.
            assert_eq!(w.flags & FLAG_INLINE, 0);
            assert_eq!(
                payload[payload.len() - FREE_BYTES..][..8],
                (1u64 << 33).to_ne_bytes()
            );
        }
        assert_eq!(decode_reply(&w, &payload), Ok(Ok(reply)));
    }
}

#[test]
fn answers_fit_the_room_their_requests_ask_for() {
    let (page_size, capacity) = (2, 64);
    let cases = [
        (
            Request::AllocPaired { n: 6 },
            Reply::PagesPaired {
                pages: vec![0; 6],
                swa_pages: vec![0; 6],
            },
        ),
        (
            Request::LockPaired {
                handle: 1,
                pages: vec![0; 5],
            },
            Reply::LockedPaired {
                lock: 1,
                delta: 0,
                swa_pages: vec![0; 5],
            },
        ),
        (
            Request::InsertPaired {
                tokens: vec![0; 9],
                pages: vec![0; 4],
                lock: true,
                mamba_state: None,
                swa_evicted: 0,
                tail: 9,
            },
            Reply::InsertedPaired {
                cached: 0,
                len: 8,
                handle: Some(1),
                locked: true,
                mamba_exist: false,
                pages: vec![0; 4],
                swa_pages: vec![0; 4],
            },
        ),
        (Request::AllocStates { n: 7 }, Reply::States(vec![0; 7])),
        (
            counted(Request::AllocPaired { n: 6 }),
            counted_reply(Reply::PagesPaired {
                pages: vec![0; 6],
                swa_pages: vec![0; 6],
            }),
        ),
    ];
    let mut payload = Vec::new();
    for (request, reply) in cases {
        let need = reply_need(&request, page_size, capacity);
        encode_reply(1, &Ok(reply.clone()), usize::MAX, &mut payload);
        assert_eq!(payload.len(), need, "{request:?}: {reply:?}");
    }
    // The room of a counted request is its own and the counts'.
    let free = Request::Free { pages: vec![1] };
    let free_counted = counted(free.clone());
    let plain = encode_request(&free, 2, 64);
    let with = encode_request(&free_counted, 2, 64);
    assert_eq!(with.reply_need, plain.reply_need + FREE_BYTES);
    assert_eq!(with.record.flags, plain.record.flags | FLAG_COUNTED);
    assert_eq!(with.payload(), plain.payload());
}

#[test]
fn malformed_step_requests_are_refused() {
    let refused = |record: WireRequest, payload: Vec<u8>| {
        let r = decode_request(&record, payload.as_slice(), &mut Spare::default());
        let err = r.as_ref().expect_err("accepted");
        assert!(
            matches!(err.kind, ErrorKind::Malformed | ErrorKind::UnknownOp),
            "{record:?}: {r:?}"
        );
    };
    // What takes no count, counted (nested counts included: the flag is
    // one bit, so a count of a count reads as a flagged count).
    for r in [
        Request::Reset,
        Request::Validate,
        Request::Bind { pool: "a=b".into() },
        Request::Namespace { name: "n".into() },
        Request::Join(Join {
            group: "g".into(),
            rank: 0,
            size: 2,
            page_size: 2,
        }),
        Request::Store(StoreRequest::Clear { ns: 1 }),
        Request::MatchAt {
            anchor: Anchor {
                node: 1,
                generation: 1,
                version: 1,
                pages_into_node: 0,
            },
            matched_pages: 1,
            next_hash: None,
            lock: false,
        },
    ] {
        let e = Call::Counted(&r).encode(2, 64);
        refused(e.record, e.payload());
    }
    // A namespaced counted request (the namespace outside the count).
    let nested = Request::Namespaced {
        ns: "a".into(),
        request: Box::new(counted(Request::Alloc { n: 1 })),
    };
    let e = encode_request(&nested, 2, 64);
    refused(e.record, e.payload());
    let insert = Request::InsertPaired {
        tokens: vec![1, 2],
        pages: vec![3],
        lock: false,
        mamba_state: Some(4),
        swa_evicted: 0,
        tail: 1,
    };
    let ins = encode_request(&insert, 2, 64);
    let ip = ins.payload();
    let alloc = encode_request(&Request::AllocPaired { n: 2 }, 2, 64);
    let lock_request = Request::LockPaired {
        handle: 1,
        pages: vec![1],
    };
    let lock = encode_request(&lock_request, 2, 64);
    let free_states = Request::FreeStates { states: vec![1] };
    let states = encode_request(&free_states, 2, 64);
    let cases: Vec<(WireRequest, Vec<u8>)> = vec![
        // InsertPaired takes its tail's word, and the state's at most.
        (
            WireRequest {
                payload_len: ins.record.payload_len - 8,
                ..ins.record
            },
            ip[..ip.len() - 8].to_vec(),
        ),
        (
            WireRequest {
                payload_len: ins.record.payload_len + 4,
                ..ins.record
            },
            [&ip[..], &[0; 4]].concat(),
        ),
        // Pages, tokens, aux or a lock flag where the op takes none.
        (
            WireRequest {
                n_pages: 1,
                payload_len: 4,
                ..alloc.record
            },
            vec![0; 4],
        ),
        (
            WireRequest {
                aux: [1, 0],
                ..alloc.record
            },
            vec![],
        ),
        (
            WireRequest {
                n_tokens: 1,
                n_pages: 0,
                ..lock.record
            },
            lock.payload(),
        ),
        (
            WireRequest {
                flags: 1,
                ..lock.record
            },
            lock.payload(),
        ),
        (
            WireRequest {
                flags: 1,
                ..states.record
            },
            states.payload(),
        ),
        (
            WireRequest {
                arg: 3,
                ..states.record
            },
            states.payload(),
        ),
        (
            WireRequest {
                op: opcode::ALLOC_STATES,
                n_pages: 1,
                payload_len: 4,
                ..WireRequest::default()
            },
            vec![0; 4],
        ),
    ];
    for (record, payload) in cases {
        refused(record, payload);
    }
}

#[test]
fn bad_step_replies_are_refused() {
    let mut payload = Vec::new();
    let pages = encode_reply(
        1,
        &Ok(Reply::PagesPaired {
            pages: vec![1, 2],
            swa_pages: vec![3, 4],
        }),
        usize::MAX,
        &mut payload,
    );
    // A page count that leaves the peers neither one each nor none.
    for a in [1, 3, 5] {
        let w = WireReply { a, ..pages };
        assert_eq!(
            decode_reply(&w, &payload),
            Err(BadReply::BadField("page count"))
        );
    }
    let ins = encode_reply(
        1,
        &Ok(Reply::InsertedPaired {
            cached: 0,
            len: 4,
            handle: None,
            locked: false,
            mamba_exist: false,
            pages: vec![1, 2],
            swa_pages: vec![],
        }),
        usize::MAX,
        &mut payload,
    );
    let mut bad = payload.clone();
    bad[..4].copy_from_slice(&3u32.to_ne_bytes());
    assert_eq!(
        decode_reply(&ins, &bad),
        Err(BadReply::BadField("page count"))
    );
    // A counted reply too short for its counts.
    let w = WireReply {
        kind: kind::PAGES,
        flags: FLAG_COUNTED,
        payload_len: 16,
        ..WireReply::default()
    };
    assert_eq!(
        decode_reply(&w, &[0; 16]),
        Err(BadReply::BadField("free counts"))
    );
}
