//! What the cargo-fuzz targets (fuzz/, `scripts/fuzz`) found, kept as
//! plain tests so the root workspace's suite catches a regression without
//! nightly or libFuzzer.

use radixd::op::{ErrorKind, Request, Spare};
use radixd::wire;

/// `wire_request`: a record's `arg` on an op that takes none was ignored
/// (a `session_commit` with `arg` 0x1b00_0000_0000 decoded as if it were
/// 0, and so re-encoded to another record). Refused now, as stray `aux`
/// words and payload fields are.
#[test]
fn an_arg_on_an_op_that_takes_none_is_malformed() {
    let tokens: Vec<u32> = (1..=4).collect();
    let takes_none = [
        Request::SessionCommit {
            session: "s1".into(),
            tokens: tokens.clone(),
            pages: vec![0, 1],
        },
        Request::Match {
            tokens: tokens.clone(),
            lock: false,
        },
        Request::Insert {
            tokens: tokens.clone(),
            pages: vec![0, 1],
            lock: true,
        },
        Request::Free { pages: vec![1] },
        Request::Stats,
        Request::Bind {
            pool: "device=cuda:0".into(),
        },
        Request::Namespaced {
            ns: "t".into(),
            request: Box::new(Request::Match {
                tokens,
                lock: false,
            }),
        },
    ];
    let mut spare = Spare::default();
    for request in &takes_none {
        let e = wire::encode_request(request, 2, 64);
        let payload = e.payload();
        assert_eq!(
            wire::decode_request(&e.record, payload.as_slice(), &mut spare).as_ref(),
            Ok(request)
        );
        let mut record = e.record;
        record.arg = 0x1b00_0000_0000;
        let refused = wire::decode_request(&record, payload.as_slice(), &mut spare)
            .expect_err("a stray arg decoded");
        assert_eq!(
            refused.kind,
            ErrorKind::Malformed,
            "{request:?}: {refused:?}"
        );
    }
    // The ops that take one still do.
    for request in [
        Request::Alloc { n: 3 },
        Request::Evict { tokens: 8 },
        Request::FreeState { state: 2 },
    ] {
        let e = wire::encode_request(&request, 2, 64);
        assert_ne!(e.record.arg, 0);
        let payload = e.payload();
        assert_eq!(
            wire::decode_request(&e.record, payload.as_slice(), &mut spare),
            Ok(request)
        );
    }
}
