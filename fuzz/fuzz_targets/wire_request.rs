//! The daemon's request decoder (`radixd::wire::decode_request`) on records
//! and payloads a client wrote: whatever they hold, a typed answer and no
//! panic; the slice and the shared-memory window decode alike; a decoded
//! request re-encodes to the very record fields and payload bytes it came
//! from; applied to an engine it leaves every invariant standing; and its
//! answer survives the reply record (`encode_reply` / `decode_reply`).
//!
//! Input: one control byte, the 56-byte record, then the payload.

#![no_main]

use std::ptr::NonNull;

use libfuzzer_sys::fuzz_target;
use radixd::engine::{Components, Config, Engine, MambaConfig, SwaConfig};
use radixd::op::{self, Request, Spare};
use radixd::wire::{self, ScratchWindow, WireRequest, MIN_REPLY_WINDOW};
use radixd_ipc::Scratch;

const RECORD: usize = std::mem::size_of::<WireRequest>();
const PAGE_SIZE: u32 = 2;
const CAPACITY: u32 = 64;

/// The record's fields from its bytes, in the host's order (as the ring
/// holds them).
fn record(b: &[u8; RECORD]) -> WireRequest {
    let u32_at = |i: usize| u32::from_ne_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    let u64_at = |i: usize| u64::from_ne_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    WireRequest {
        seq: u64_at(0),
        op: u32_at(8),
        flags: u32_at(12),
        arg: u64_at(16),
        payload_off: u32_at(24),
        payload_len: u32_at(28),
        n_tokens: u32_at(32),
        n_pages: u32_at(36),
        reply_off: u32_at(40),
        reply_len: u32_at(44),
        aux: [u32_at(48), u32_at(52)],
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&control, rest)) = data.split_first() else {
        return;
    };
    if rest.len() < RECORD {
        return;
    }
    let (head, payload) = rest.split_at(RECORD);
    let mut r = record(head.try_into().expect("RECORD bytes"));
    // Steering bits, so most inputs get past the first checks (the raw
    // record is still tried when they are clear).
    if control & 1 != 0 {
        r.payload_len = payload.len() as u32;
    }
    if control & 2 != 0 {
        let words = (payload.len() / 4) as u32;
        r.n_tokens %= words + 1;
        r.n_pages %= words - r.n_tokens + 1;
    }
    if control & 4 != 0 {
        r.op %= 48;
    }
    if control & 8 != 0 {
        r.flags &= 0x11;
    }

    let mut spare = Spare::default();
    let decoded = wire::decode_request(&r, payload, &mut spare);

    // The daemon's path: the same bytes in a scratch window of shared memory.
    let mut scratch_mem = vec![0u8; payload.len() + 64];
    let at = (control as usize >> 4) % 64;
    scratch_mem[at..at + payload.len()].copy_from_slice(payload);
    // SAFETY: `scratch_mem` is a live, private buffer of that length, used by
    // nothing else while the view lives.
    let scratch = unsafe {
        Scratch::from_raw(
            NonNull::new(scratch_mem.as_mut_ptr()).expect("a Vec's pointer"),
            scratch_mem.len() as u64,
        )
    };
    let window = ScratchWindow::new(&scratch, at as u32, payload.len() as u32)
        .expect("the window lies inside the scratch");
    let windowed = wire::decode_request(&r, &window, &mut spare);
    assert_eq!(decoded, windowed, "slice and scratch window decode apart");

    let request = match decoded {
        Ok(request) => request,
        Err(rejection) => {
            assert!(!rejection.message.is_empty(), "a refusal without a reason");
            check_reply_roundtrip(&Err(rejection), 0);
            return;
        }
    };

    // Re-encoded, the request is the record and payload it came from.
    let e = wire::encode_request(&request, PAGE_SIZE, CAPACITY);
    let fields = |w: &WireRequest| (w.op, w.flags, w.arg, w.n_tokens, w.n_pages, w.aux);
    assert_eq!(
        fields(&e.record),
        fields(&r),
        "{request:?} re-encodes to another record"
    );
    assert_eq!(e.record.payload_len as usize, payload.len());
    assert_eq!(
        e.payload(),
        payload,
        "{request:?} re-encodes to another payload"
    );
    assert_eq!(
        wire::decode_request(&e.record, e.payload().as_slice(), &mut spare).as_ref(),
        Ok(&request)
    );

    // Applied: every invariant holds after it, accepted or refused.
    let components = if control & 0x80 != 0 {
        Components {
            swa: Some(SwaConfig {
                window: 4,
                capacity: CAPACITY,
            }),
            mamba: Some(MambaConfig { capacity: 8 }),
        }
    } else {
        Components::full()
    };
    let config = Config {
        page_size: PAGE_SIZE,
        capacity: CAPACITY,
    };
    let mut engine = Engine::with_components(config, components).expect("a valid configuration");
    let need = wire::reply_need(&request, PAGE_SIZE, CAPACITY);
    let is_store = matches!(request, Request::Store(_));
    let result = op::apply(&mut engine, 1, request);
    if let Err(e) = engine.validate() {
        panic!("invariant broken after {result:?}: {e}");
    }
    if !is_store {
        check_reply_roundtrip(&result, need);
    }
});

/// The answer goes through a reply record and window and comes back the
/// same (an error message cut to the window at most).
fn check_reply_roundtrip(result: &Result<op::Reply, op::Rejection>, need: usize) {
    let room = need.max(MIN_REPLY_WINDOW);
    let mut window = Vec::new();
    let w = wire::encode_reply(7, result, room, &mut window);
    assert!(window.len() <= room, "a reply payload past its window");
    let back = wire::decode_reply(&w, &window).expect("the daemon's own reply decodes");
    match (result, back) {
        (Ok(sent), Ok(got)) => assert_eq!(*sent, got),
        (Err(sent), Err(got)) => {
            assert_eq!(sent.kind, got.kind);
            assert!(sent.message.starts_with(&got.message));
        }
        (sent, got) => panic!("sent {sent:?}, decoded {got:?}"),
    }
}
