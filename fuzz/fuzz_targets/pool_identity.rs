//! Pool identities (`radixd::binding`), which any client may send in a
//! `bind`: the parser either refuses with a typed error or gives the
//! canonical form (at most `MAX_POOL_IDENTITY` bytes, a fixed point of
//! the parser, the same for the pairs in any order, every pair said kept);
//! the daemon's `Binding`, driven by binds and releases of several
//! clients, answers as a model of its rules and changes nothing when it
//! refuses; its board shows what it holds; and a board holding bytes
//! anyone wrote reads as a binding, `Garbled` or `Changing`, never a panic.
//!
//! Input: steps separated by `0xff` bytes, each a byte naming the step and
//! the client, then an identity's text.

#![no_main]

use std::collections::BTreeSet;
use std::mem::{align_of, size_of};

use libfuzzer_sys::fuzz_target;
use radixd::binding::{Binding, BindingBoard, PoolBinding, MAX_POOL_IDENTITY};
use radixd::op::{ErrorKind, Rejection};
use radixd::PoolIdentity;

fuzz_target!(|data: &[u8]| {
    garbled_board(data);
    let board = BindingBoard::default();
    let mut binding = Binding::new(&board);
    // The model: the bound identity and its holders.
    let mut bound: Option<PoolIdentity> = None;
    let mut holders: BTreeSet<u32> = BTreeSet::new();
    for step in data.split(|&b| b == 0xff) {
        let Some((&head, text)) = step.split_first() else {
            continue;
        };
        let text = String::from_utf8_lossy(text);
        let client = u32::from(head >> 1 & 3);
        if head & 1 == 0 {
            let parsed = check_parse(&text);
            let got = binding.bind(client, &text);
            match parsed {
                Err(_) => {
                    assert_eq!(kind(&got), Some(ErrorKind::Malformed), "{text:?}: {got:?}");
                }
                Ok(asked) => match &bound {
                    Some(b) if *b != asked => {
                        let Err(refusal) = &got else {
                            panic!("{asked} bound over {b}: {got:?}");
                        };
                        assert_eq!(refusal.kind, ErrorKind::PoolMismatch);
                        // What to act on: every key that differs, by name.
                        for (key, _, _) in b.differences(&asked) {
                            assert!(
                                refusal.message.contains(key),
                                "refusal {:?} does not name key {key}",
                                refusal.message
                            );
                        }
                    }
                    _ => {
                        bound = Some(asked);
                        holders.insert(client);
                        assert_eq!(got.as_ref().ok(), Some(&(holders.len() as u64)));
                    }
                },
            }
        } else {
            let released = binding.release(client);
            let held = holders.remove(&client);
            if holders.is_empty() {
                bound = None;
            }
            let expected = match (held, holders.is_empty()) {
                (false, _) => radixd::binding::Released::NotHeld,
                (true, false) => radixd::binding::Released::Held,
                (true, true) => radixd::binding::Released::Unbound,
            };
            assert_eq!(released, expected);
        }
        assert_eq!(binding.identity(), bound.as_ref());
        assert_eq!(binding.holders(), holders.len() as u64);
        let shown = board.read().expect("the board of this very binding");
        let model = bound.clone().map(|identity| PoolBinding {
            identity,
            holders: holders.len() as u64,
        });
        assert_eq!(shown, model);
    }
});

fn kind(r: &Result<u64, Rejection>) -> Option<ErrorKind> {
    r.as_ref().err().map(|e| e.kind)
}

/// Parses `text` and checks what a parse must give.
fn check_parse(text: &str) -> Result<PoolIdentity, ()> {
    let id = match PoolIdentity::parse(text) {
        Ok(id) => id,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            assert_eq!(Rejection::from(e).kind, ErrorKind::Malformed);
            return Err(());
        }
    };
    let canonical = id.as_str();
    assert!(
        canonical.len() <= MAX_POOL_IDENTITY,
        "{canonical:?} too long"
    );
    assert!(
        text.len() <= MAX_POOL_IDENTITY,
        "{text:?} accepted over the limit"
    );
    assert_eq!(
        PoolIdentity::parse(canonical).as_ref(),
        Ok(&id),
        "not a fixed point"
    );
    // The same pairs in another order are the same buffer.
    let reversed = text.split(';').rev().collect::<Vec<_>>().join(";");
    assert_eq!(PoolIdentity::parse(&reversed).as_ref(), Ok(&id));
    // Keys sorted and unique; every pair said is there, value and all.
    let keys: Vec<&str> = id.pairs().map(|(k, _)| k).collect();
    assert!(
        keys.windows(2).all(|w| w[0] < w[1]),
        "keys not canonical: {keys:?}"
    );
    for piece in text.split(';') {
        let (k, v) = piece.split_once('=').expect("an accepted piece is a pair");
        assert_eq!(id.get(k), Some(v));
    }
    assert_eq!(keys.len(), text.split(';').count());
    assert!(id.differences(&id).is_empty());
    Ok(id)
}

/// A board whose bytes someone else wrote (the segment is shared): read as
/// a valid binding, or refused, never a panic or an identity that does not
/// parse.
fn garbled_board(data: &[u8]) {
    const WORDS: usize = size_of::<BindingBoard>().div_ceil(8);
    const _: () = assert!(align_of::<BindingBoard>() <= align_of::<u64>());
    let mut words = [0u64; WORDS];
    for (w, chunk) in words.iter_mut().zip(data.chunks(8)) {
        let mut b = [0u8; 8];
        b[..chunk.len()].copy_from_slice(chunk);
        *w = u64::from_le_bytes(b);
    }
    // SAFETY: `BindingBoard` is `ShmSafe` (atomics only, valid for every bit
    // pattern), no larger than `words` and no more aligned than `u64`; the
    // buffer outlives the reference and nothing else touches it.
    let board = unsafe { &*words.as_ptr().cast::<BindingBoard>() };
    if let Ok(Some(b)) = board.read() {
        assert_eq!(
            PoolIdentity::parse(b.identity.as_str()).as_ref(),
            Ok(&b.identity)
        );
    }
}
