//! Unit tests of the wire: every request and reply round trips, a scratch
//! window decodes like a buffer, garbage and malformed records are refused,
//! steps' digests tell requests apart.

use super::*;

#[test]
fn error_messages_are_cut_on_character_boundaries() {
    assert_eq!(utf8_prefix("µµµ", 3), "µ");
    assert_eq!(utf8_prefix("µµµ", 4), "µµ");
    assert_eq!(utf8_prefix("abc", 10), "abc");
    assert_eq!(utf8_prefix("µ", 1), "");
    let r = Err(Rejection::new(ErrorKind::Malformed, "ééééé"));
    let mut bytes = Vec::new();
    let w = encode_reply(1, &r, 5, &mut bytes);
    assert_eq!(
        inline_payload(&w).unwrap().unwrap_or(&bytes),
        "éé".as_bytes()
    );
    let long = Err(Rejection::new(ErrorKind::Malformed, "éééééé"));
    encode_reply(1, &long, 11, &mut bytes);
    assert_eq!(bytes, "ééééé".as_bytes());
}

pub(super) fn requests() -> Vec<Request> {
    vec![
        Request::Alloc { n: 7 },
        Request::Free { pages: vec![1, 2] },
        Request::Insert {
            tokens: vec![1, 2, 3],
            pages: vec![9],
            lock: true,
        },
        Request::Match {
            tokens: vec![4, 5],
            lock: false,
        },
        Request::Lock {
            handle: 1 << 40 | 3,
        },
        Request::Unlock { handle: 5 },
        Request::Evict { tokens: 64 },
        Request::SessionCommit {
            session: "chat-é".into(),
            tokens: vec![1],
            pages: vec![],
        },
        Request::SessionRelease {
            session: "s".into(),
        },
        Request::SessionStatus {
            session: "s".into(),
        },
        Request::Stats,
        Request::Reset,
        Request::Validate,
        Request::MatchAt {
            anchor: ANCHOR,
            matched_pages: 9,
            next_hash: Some(0xdead_beef),
            lock: true,
        },
        Request::MatchAt {
            anchor: ANCHOR,
            matched_pages: 2,
            next_hash: None,
            lock: false,
        },
        Request::InsertAt {
            anchor: ANCHOR,
            matched_pages: 1,
            tokens: vec![7, 8],
            pages: vec![3, 4],
            lock: true,
        },
        Request::MatchWith {
            tokens: vec![4, 5, 6],
            lock: true,
        },
        Request::InsertWith {
            tokens: vec![1, 2, 3],
            pages: vec![9, 10],
            lock: false,
            mamba_state: Some(u32::MAX),
            swa_evicted: 1 << 40,
        },
        Request::InsertWith {
            tokens: vec![1],
            pages: vec![],
            lock: true,
            mamba_state: None,
            swa_evicted: 0,
        },
        Request::EvictComponents {
            tokens: 3,
            swa_tokens: u64::MAX,
            mamba_states: 1 << 33 | 5,
        },
        Request::AllocState,
        Request::FreeState { state: 1 << 35 },
        Request::FreeSwa { pages: vec![2, 3] },
        Request::SwaPages { pages: vec![4, 0] },
        Request::StatsWith,
        Request::Bind {
            pool: "device=cuda:0;pages=64".into(),
        },
        Request::Walk {
            tokens: vec![5, 6, 7, 8, 9],
        },
        Request::Join(Join {
            group: "127.0.0.1:30000/7f3a".into(),
            rank: 3,
            size: 8,
            page_size: 16,
        }),
        Request::Store(StoreRequest::Namespace {
            name: b"model-tp0".to_vec(),
            value_size: 1 << 20,
        }),
        Request::Store(StoreRequest::Reserve {
            ns: 3,
            keys: {
                let mut keys = crate::op::KeyList::default();
                keys.push(b"a", None);
                keys.push(b"bb", Some(b"a"));
                keys
            },
        }),
        Request::Store(StoreRequest::Commit {
            ns: 3,
            slots: vec![crate::store::StoreSlot {
                index: 7,
                generation: 2,
                offset: 1 << 33,
            }],
        }),
        Request::Store(StoreRequest::Abort {
            ns: 0,
            slots: vec![],
        }),
        Request::Store(StoreRequest::Clear { ns: 9 }),
    ]
}

const ANCHOR: Anchor = Anchor {
    node: 5,
    generation: 3,
    version: 12,
    pages_into_node: 2,
};

#[test]
fn anchored_requests_carry_the_anchor_in_the_record_and_no_key_prefix() {
    let m = Request::MatchAt {
        anchor: ANCHOR,
        matched_pages: 9,
        next_hash: None,
        lock: true,
    };
    let e = encode_request(&m, 4, 64);
    assert_eq!(e.record.arg, 3 << 32 | 5);
    assert_eq!(e.record.aux, [12, 2]);
    assert_eq!((e.record.n_tokens, e.record.n_pages), (0, 0));
    assert_eq!(e.payload_len(), 4);
    assert_eq!(reply_need(&m, 4, 64), 0);
}

#[test]
fn malformed_anchored_records_are_rejected() {
    let m = Request::MatchAt {
        anchor: ANCHOR,
        matched_pages: 9,
        next_hash: Some(1),
        lock: true,
    };
    let good = encode_request(&m, 1, 64);
    let p = good.payload();
    let i = Request::InsertAt {
        anchor: ANCHOR,
        matched_pages: 1,
        tokens: vec![7, 8],
        pages: vec![3, 4],
        lock: false,
    };
    let ins = encode_request(&i, 1, 64);
    let ip = ins.payload();
    let cases: Vec<(WireRequest, Vec<u8>)> = vec![
        // Tokens on a MatchAt, and words of the wrong count.
        (
            WireRequest {
                n_tokens: 1,
                ..good.record
            },
            p.clone(),
        ),
        (
            WireRequest {
                payload_len: 12,
                ..good.record
            },
            [&p[..], &[0; 4]].concat(),
        ),
        (
            WireRequest {
                payload_len: 0,
                ..good.record
            },
            vec![],
        ),
        (
            WireRequest {
                payload_len: 6,
                ..good.record
            },
            p[..6].to_vec(),
        ),
        // InsertAt takes one word after the pages, exactly.
        (
            WireRequest {
                payload_len: ins.record.payload_len - 4,
                ..ins.record
            },
            ip[..ip.len() - 4].to_vec(),
        ),
        (
            WireRequest {
                payload_len: ins.record.payload_len + 4,
                ..ins.record
            },
            [&ip[..], &[0; 4]].concat(),
        ),
        // Aux words on an op that takes none.
        (
            WireRequest {
                op: opcode::STATS,
                aux: [1, 0],
                ..WireRequest::default()
            },
            vec![],
        ),
        (
            WireRequest {
                flags: 0x10,
                ..good.record
            },
            p.clone(),
        ),
    ];
    for (record, payload) in cases {
        let r = decode_request(&record, payload.as_slice(), &mut Spare::default());
        let err = r.as_ref().expect_err("accepted");
        assert_eq!(err.kind, ErrorKind::Malformed, "{record:?}: {r:?}");
    }
}

#[test]
fn calls_are_stepped_as_requests_are_and_digests_tell_requests_apart() {
    let all = requests();
    let digests: Vec<[u64; 2]> = all
        .iter()
        .map(|r| {
            assert_eq!(
                Call::of(r).is_stepped(),
                crate::group::is_stepped(r),
                "{r:?}"
            );
            digest(&encode_request(r, 4, 64))
        })
        .collect();
    for (i, a) in digests.iter().enumerate() {
        for (j, b) in digests.iter().enumerate().skip(i + 1) {
            assert_ne!(a, b, "{:?} and {:?}", all[i], all[j]);
        }
    }
    // One token more, one page other, the lock flag: other digests.
    let base = Request::Insert {
        tokens: vec![1, 2, 3, 4],
        pages: vec![9],
        lock: false,
    };
    let d = |r: &Request| digest(&encode_request(r, 4, 64));
    for other in [
        Request::Insert {
            tokens: vec![1, 2, 3, 4, 0],
            pages: vec![9],
            lock: false,
        },
        Request::Insert {
            tokens: vec![1, 2, 3, 4],
            pages: vec![8],
            lock: false,
        },
        Request::Insert {
            tokens: vec![1, 2, 3, 4],
            pages: vec![9],
            lock: true,
        },
    ] {
        assert_ne!(d(&base), d(&other), "{other:?}");
    }
    assert_eq!(d(&base), d(&base.clone()));
    // A reply survives its words.
    let mut payload = Vec::new();
    let w = encode_reply(7, &Ok(Reply::Pages(vec![1, 2, 3])), 64, &mut payload);
    assert_eq!(reply_of_words(7, reply_words(&w)), w);
}

#[test]
fn every_request_round_trips() {
    for request in requests() {
        let e = encode_request(&request, 1, 64);
        assert_eq!(e.payload().len(), e.record.payload_len as usize);
        assert_eq!(
            decode_request(&e.record, e.payload().as_slice(), &mut Spare::default()),
            Ok(request.clone())
        );
    }
}

#[test]
fn a_scratch_window_at_any_offset_decodes_like_a_buffer() {
    let mut mem = vec![0u64; 512];
    let base = std::ptr::NonNull::new(mem.as_mut_ptr().cast::<u8>()).unwrap();
    // SAFETY: `mem` outlives `scratch` and is touched only through it.
    let scratch = unsafe { Scratch::from_raw(base, 4096) };
    for (i, request) in requests().into_iter().enumerate() {
        let e = encode_request(&request, 1, 64);
        let at = (i * 37 % 100) as u32;
        scratch.write_bytes(u64::from(at), &e.payload()).unwrap();
        let window = ScratchWindow::new(&scratch, at, e.record.payload_len).unwrap();
        assert_eq!(
            decode_request(&e.record, &window, &mut Spare::default()),
            Ok(request)
        );
    }
    assert!(ScratchWindow::new(&scratch, 4000, 97).is_err());
    // Pieces outside the window are refused even inside the scratch.
    let window = ScratchWindow::new(&scratch, 8, 16).unwrap();
    let mut out = vec![9; 7];
    window.words(0, 4, &mut out).unwrap();
    assert_eq!(out.len(), 4);
    assert!(window.words(4, 4, &mut out).is_err());
    assert!(window.bytes(16, 1).is_err());
    assert!(window.words(usize::MAX, 1, &mut out).is_err());
    assert!(window.words(0, usize::MAX, &mut out).is_err());
    assert!(<[u8] as Payload>::words(&[0; 8], 1, usize::MAX, &mut out).is_err());
    assert!(<[u8] as Payload>::bytes(&[0; 8], usize::MAX, 2).is_err());
    assert!(ScratchWindow::new(&scratch, u32::MAX, u32::MAX).is_err());
}

#[test]
fn every_reply_round_trips() {
    let stats = Stats {
        total_tokens: 1,
        nodes: 2,
        evicted_pages: 3,
        ..Stats::default()
    };
    let replies = vec![
        Ok(Reply::Pages(vec![3, 4])),
        Ok(Reply::Done),
        Ok(Reply::Locked((7 << 32) | (1 << 31) | 5)),
        Ok(Reply::Inserted {
            cached: 1,
            len: 2,
            handle: Some(9),
            locked: true,
        }),
        Ok(Reply::Inserted {
            cached: 1,
            len: 2,
            handle: None,
            locked: false,
        }),
        Ok(Reply::Matched {
            len: 4,
            pages: vec![1],
            handle: None,
        }),
        Ok(Reply::Matched {
            len: 4,
            pages: vec![1],
            handle: Some(7),
        }),
        Ok(Reply::Evicted(16)),
        Ok(Reply::Session {
            resident_tokens: 5,
            idle_ms: 6,
        }),
        Ok(Reply::Stats { stats, sessions: 4 }),
        Err(Rejection::new(ErrorKind::StaleHandle, "gone")),
        Ok(Reply::MatchedWith {
            len: 4,
            pages: vec![1, 2],
            handle: Some(3),
            full_len: 8,
            mamba_state: Some(7),
        }),
        Ok(Reply::MatchedWith {
            len: 0,
            pages: vec![],
            handle: None,
            full_len: 8,
            mamba_state: Some(0),
        }),
        Ok(Reply::MatchedWith {
            len: 4,
            pages: vec![1, 2, 3],
            handle: None,
            full_len: 4,
            mamba_state: None,
        }),
        Ok(Reply::InsertedWith {
            cached: 1,
            len: 2,
            handle: Some(9),
            locked: true,
            mamba_exist: true,
        }),
        Ok(Reply::InsertedWith {
            cached: 1,
            len: 2,
            handle: None,
            locked: false,
            mamba_exist: false,
        }),
        Ok(Reply::EvictedComponents {
            tokens: 1,
            swa_tokens: 2,
            mamba_states: 3,
        }),
        Ok(Reply::State { state: u32::MAX }),
        Ok(Reply::SwaFreed { n: 6 }),
        Ok(Reply::SwaPages(vec![7, u32::MAX])),
        Ok(Reply::StatsWith {
            stats,
            sessions: 1,
            components: None,
        }),
        Ok(Reply::StatsWith {
            stats,
            sessions: 1,
            components: Some(ComponentStats {
                swa_evictable_tokens: 1,
                swa_free_pages: 3,
                mamba_protected_states: 5,
                evict_scanned_mamba: 8,
                ..ComponentStats::default()
            }),
        }),
        Err(Rejection::new(ErrorKind::ComponentOff, "no mamba")),
        Err(Rejection::new(ErrorKind::StateNotOwned, "slot 3")),
        Err(Rejection::new(ErrorKind::SwaMismatch, "window")),
        Err(Rejection::new(ErrorKind::InsufficientStates, "full")),
        Ok(Reply::Bound { holders: 3 }),
        Err(Rejection::new(ErrorKind::PoolMismatch, "another buffer")),
        Ok(Reply::Joined {
            joined: 2,
            size: 8,
            board: Some(3),
        }),
        Ok(Reply::Joined {
            joined: 1,
            size: 1,
            board: None,
        }),
        Err(Rejection::new(ErrorKind::Desync, "step 3")),
    ];
    let mut payload = Vec::new();
    for reply in replies {
        let w = encode_reply(42, &reply, usize::MAX, &mut payload);
        assert_eq!(w.seq, 42);
        assert_eq!(decode_reply(&w, &payload), Ok(reply));
    }
}

#[test]
fn small_answers_travel_in_the_record() {
    let mut payload = vec![1, 2, 3];
    for (pages, inline) in [
        (vec![], true),
        (vec![7], true),
        (vec![7, 8], true),
        (vec![7, 8, 9], false),
    ] {
        let reply = Ok(Reply::Pages(pages.clone()));
        let w = encode_reply(1, &reply, usize::MAX, &mut payload);
        assert_eq!(w.flags & FLAG_INLINE != 0, inline, "{pages:?}");
        assert_eq!(payload.is_empty(), inline);
        assert_eq!(inline_payload(&w).unwrap().is_some(), inline);
        // An inline answer ignores whatever the window holds.
        let window = if inline {
            &[0xff; 12][..]
        } else {
            &payload[..]
        };
        assert_eq!(decode_reply(&w, window), Ok(reply));
    }
    let short = Err(Rejection::new(ErrorKind::StaleHandle, "gone"));
    let w = encode_reply(1, &short, usize::MAX, &mut payload);
    assert_eq!(decode_reply(&w, &[]), Ok(short));
    // A daemon claiming more inline bytes than the record holds.
    let bad = WireReply {
        flags: FLAG_INLINE,
        payload_len: 9,
        kind: kind::PAGES,
        ..WireReply::default()
    };
    assert_eq!(decode_reply(&bad, &[]), Err(BadReply::PayloadLength));
}

#[test]
fn garbage_records_are_rejected_not_trusted() {
    let insert = Request::Insert {
        tokens: vec![1, 2],
        pages: vec![3],
        lock: false,
    };
    let good = encode_request(&insert, 1, 64);
    let good_payload = good.payload();
    let cases: Vec<(WireRequest, &[u8])> = vec![
        (
            WireRequest {
                op: 99,
                ..good.record
            },
            &good_payload,
        ),
        (
            WireRequest {
                flags: 0x80,
                ..good.record
            },
            &good_payload,
        ),
        (
            WireRequest {
                n_tokens: u32::MAX,
                ..good.record
            },
            &good_payload,
        ),
        (
            WireRequest {
                n_pages: 1000,
                ..good.record
            },
            &good_payload,
        ),
        (
            WireRequest {
                payload_len: 3,
                ..good.record
            },
            &good_payload,
        ),
        (
            WireRequest {
                op: opcode::STATS,
                ..good.record
            },
            &good_payload,
        ),
        (
            WireRequest {
                op: opcode::ALLOC,
                flags: FLAG_LOCK,
                ..WireRequest::default()
            },
            &[],
        ),
        (
            WireRequest {
                op: opcode::SESSION_STATUS,
                ..WireRequest::default()
            },
            &[],
        ),
    ];
    let spare = &mut Spare::default();
    for (record, payload) in cases {
        let r = decode_request(&record, payload, spare);
        assert!(r.is_err(), "{record:?} was accepted as {r:?}");
    }
    let bad_utf8 = WireRequest {
        op: opcode::SESSION_RELEASE,
        payload_len: 2,
        ..WireRequest::default()
    };
    assert!(decode_request(&bad_utf8, &[0xff, 0xfe][..], spare).is_err());
    let aux = WireRequest {
        op: opcode::STATS,
        aux: [0, 1],
        ..WireRequest::default()
    };
    assert!(decode_request(&aux, &[][..], spare).is_err());
}

#[test]
fn bind_records_carry_a_bounded_utf8_identity_and_nothing_else() {
    let spare = &mut Spare::default();
    let bind = |text: &[u8]| WireRequest {
        op: opcode::BIND,
        payload_len: text.len() as u32,
        ..WireRequest::default()
    };
    let fits = vec![b'a'; MAX_POOL_IDENTITY];
    assert!(decode_request(&bind(&fits), &fits[..], spare).is_ok());
    let over = vec![b'a'; MAX_POOL_IDENTITY + 1];
    let e = decode_request(&bind(&over), &over[..], spare).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Malformed);
    assert!(e.message.contains("over the limit"), "{e}");
    let e = decode_request(&bind(&[0xff, 0x3d]), &[0xff, 0x3d][..], spare).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Malformed);
    let with_pages = WireRequest {
        n_pages: 1,
        payload_len: 8,
        ..bind(b"a=1")
    };
    assert!(decode_request(
        &with_pages,
        &[0, 0, 0, 0, b'a', b'=', b'1', b'2'][..],
        spare
    )
    .is_err());
    let locked = WireRequest {
        flags: FLAG_LOCK,
        ..bind(b"a=1")
    };
    assert!(decode_request(&locked, &b"a=1"[..], spare).is_err());
}

#[test]
fn malformed_component_records_are_rejected() {
    let spare = &mut Spare::default();
    let evict = Request::EvictComponents {
        tokens: 1,
        swa_tokens: 2,
        mamba_states: 3,
    };
    let e = encode_request(&evict, 1, 64);
    let p = e.payload();
    let insert = Request::InsertWith {
        tokens: vec![1, 2],
        pages: vec![3, 4],
        lock: false,
        mamba_state: Some(1),
        swa_evicted: 0,
    };
    let i = encode_request(&insert, 1, 64);
    let ip = i.payload();
    let cases: Vec<(WireRequest, Vec<u8>)> = vec![
        // Evict takes exactly four words.
        (
            WireRequest {
                payload_len: 12,
                ..e.record
            },
            p[..12].to_vec(),
        ),
        (
            WireRequest {
                payload_len: 0,
                ..e.record
            },
            vec![],
        ),
        (
            WireRequest {
                payload_len: 20,
                ..e.record
            },
            [&p[..], &[0; 4]].concat(),
        ),
        // Tokens on an evict.
        (
            WireRequest {
                n_tokens: 1,
                ..e.record
            },
            p.clone(),
        ),
        // An insert's state is one word, not two or a part of one.
        (
            WireRequest {
                payload_len: i.record.payload_len + 4,
                ..i.record
            },
            [&ip[..], &[0; 4]].concat(),
        ),
        (
            WireRequest {
                payload_len: i.record.payload_len - 2,
                ..i.record
            },
            ip[..ip.len() - 2].to_vec(),
        ),
        // Lock flags, payloads and aux words on ops that take none.
        (
            WireRequest {
                op: opcode::ALLOC_STATE,
                flags: FLAG_LOCK,
                ..WireRequest::default()
            },
            vec![],
        ),
        (
            WireRequest {
                op: opcode::FREE_STATE,
                n_pages: 1,
                payload_len: 4,
                ..WireRequest::default()
            },
            vec![0; 4],
        ),
        (
            WireRequest {
                op: opcode::STATS_WITH,
                aux: [1, 0],
                ..WireRequest::default()
            },
            vec![],
        ),
        (
            WireRequest {
                op: opcode::FREE_SWA,
                n_tokens: 1,
                payload_len: 4,
                ..WireRequest::default()
            },
            vec![0; 4],
        ),
    ];
    for (record, payload) in cases {
        let r = decode_request(&record, payload.as_slice(), spare);
        let err = r.as_ref().expect_err("accepted");
        assert_eq!(err.kind, ErrorKind::Malformed, "{record:?}: {r:?}");
    }
}

#[test]
fn bad_component_replies_are_protocol_errors() {
    // A state word promised but absent, a slot beyond 32 bits, and
    // stats whose size disagrees with the flag.
    let no_state = WireReply {
        kind: kind::MATCHED_WITH,
        flags: FLAG_EXTRA | FLAG_INLINE,
        ..WireReply::default()
    };
    assert!(matches!(
        decode_reply(&no_state, &[]),
        Err(BadReply::BadField(_))
    ));
    let wide = WireReply {
        kind: kind::STATE,
        a: 1 << 32,
        flags: FLAG_INLINE,
        ..WireReply::default()
    };
    assert!(matches!(
        decode_reply(&wide, &[]),
        Err(BadReply::BadField(_))
    ));
    let mut payload = Vec::new();
    let reply = Ok(Reply::StatsWith {
        stats: Stats::default(),
        sessions: 0,
        components: None,
    });
    let mut w = encode_reply(1, &reply, usize::MAX, &mut payload);
    w.flags |= FLAG_EXTRA;
    assert_eq!(
        decode_reply(&w, &payload),
        Err(BadReply::StatsSize(STATS_BYTES))
    );
}
