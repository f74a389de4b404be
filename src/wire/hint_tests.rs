//! Unit tests of an insert's hints on the wire (`Request::Hinted`): they
//! round trip alone, inside a namespace, counted and by anchor, through a
//! buffer and a scratch window; the hints tell digests apart; and hints on
//! what takes none, or a payload too short for them, are refused. Apart
//! from `tests` because they are one feature's.

use super::record::{opcode, FLAG_HINTS, HINTS_BYTES};
use super::tests::requests;
use super::*;
use crate::engine::{Anchor, InsertHints};

fn hinted(priority: i64, inserted_len: u64, request: Request) -> Request {
    Request::Hinted {
        hints: InsertHints {
            priority,
            inserted_len,
        },
        request: Box::new(request),
    }
}

fn insert(lock: bool) -> Request {
    Request::Insert {
        tokens: vec![1, 2, 3, 4],
        pages: vec![9, 10],
        lock,
    }
}

fn hinted_requests() -> Vec<Request> {
    let at = Request::InsertAt {
        anchor: Anchor {
            node: 5,
            generation: 3,
            version: 12,
            pages_into_node: 2,
        },
        matched_pages: 1,
        tokens: vec![7, 8],
        pages: vec![3, 4],
        lock: true,
    };
    vec![
        hinted(3, 0, insert(false)),
        hinted(-1, 1 << 40, insert(true)),
        hinted(i64::MIN, u64::MAX, insert(false)),
        hinted(i64::MAX, 4, at),
        Request::Namespaced {
            ns: "lora-7".into(),
            request: Box::new(hinted(2, 4, insert(true))),
        },
        Request::Counted(Box::new(Request::Namespaced {
            ns: "t".into(),
            request: Box::new(hinted(0, 8, insert(false))),
        })),
        Request::Counted(Box::new(hinted(5, 0, insert(false)))),
        // A hybrid engine's inserts take them too.
        hinted(
            7,
            2,
            Request::InsertWith {
                tokens: vec![1, 2, 3, 4],
                pages: vec![9, 10],
                lock: true,
                mamba_state: Some(3),
                swa_evicted: 2,
            },
        ),
        Request::Namespaced {
            ns: "t".into(),
            request: Box::new(hinted(
                -3,
                4,
                Request::InsertPaired {
                    tokens: vec![1, 2, 3, 4],
                    pages: vec![9, 10],
                    lock: false,
                    mamba_state: None,
                    swa_evicted: 0,
                    tail: 2,
                },
            )),
        },
    ]
}

#[test]
fn hinted_inserts_round_trip() {
    let mut mem = vec![0u64; 512];
    let base = std::ptr::NonNull::new(mem.as_mut_ptr().cast::<u8>()).unwrap();
    // SAFETY: `mem` outlives `scratch` and is touched only through it.
    let scratch = unsafe { radixd_ipc::Scratch::from_raw(base, 4096) };
    for (i, request) in hinted_requests().into_iter().enumerate() {
        let e = encode_request(&request, 1, 64);
        assert_ne!(e.record.flags & FLAG_HINTS, 0, "{request:?}");
        assert_eq!(e.payload().len(), e.record.payload_len as usize);
        let decoded = decode_request(&e.record, e.payload().as_slice(), &mut Spare::default());
        assert_eq!(decoded, Ok(request.clone()));
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
fn hints_tell_digests_apart() {
    let all: Vec<Request> = requests().into_iter().chain(hinted_requests()).collect();
    let d = |r: &Request| digest(&encode_request(r, 4, 64));
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            assert_ne!(d(a), d(b), "{a:?} and {b:?}");
        }
    }
    assert_ne!(
        d(&hinted(1, 0, insert(false))),
        d(&hinted(2, 0, insert(false)))
    );
    assert_ne!(
        d(&hinted(1, 0, insert(false))),
        d(&hinted(1, 1, insert(false)))
    );
    // Default hints are still hints on the wire: another request.
    assert_ne!(d(&hinted(0, 0, insert(false))), d(&insert(false)));
}

#[test]
fn hints_on_what_takes_none_or_outside_the_payload_are_refused() {
    let m = Request::Match {
        tokens: vec![1, 2],
        lock: false,
    };
    let e = encode_request(&m, 1, 64);
    let mut payload = e.payload();
    payload.extend_from_slice(&[0; HINTS_BYTES]);
    let on_match = WireRequest {
        flags: e.record.flags | FLAG_HINTS,
        payload_len: payload.len() as u32,
        ..e.record
    };
    let h = hinted(1, 2, insert(false));
    let good = encode_request(&h, 1, 64);
    let gp = good.payload();
    let cases = vec![
        (on_match, payload),
        // Shorter than the hints.
        (
            WireRequest {
                op: opcode::STATS,
                flags: FLAG_HINTS,
                payload_len: 8,
                ..WireRequest::default()
            },
            vec![0; 8],
        ),
        // The hints cut short: the insert's pages then do not fit.
        (
            WireRequest {
                payload_len: good.record.payload_len - 4,
                ..good.record
            },
            gp[..gp.len() - 4].to_vec(),
        ),
        // Hints twice: the insert carries bytes it does not take.
        (
            WireRequest {
                payload_len: good.record.payload_len + HINTS_BYTES as u32,
                ..good.record
            },
            [&gp[..], &[0; HINTS_BYTES]].concat(),
        ),
    ];
    for (k, (record, payload)) in cases.into_iter().enumerate() {
        let r = decode_request(&record, payload.as_slice(), &mut Spare::default());
        let err = r.as_ref().expect_err("accepted");
        assert_eq!(err.kind, ErrorKind::Malformed, "case {k}: {r:?}");
    }
}
