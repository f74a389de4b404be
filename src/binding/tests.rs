//! Unit tests of the binding: identities, `admits`, the board.

use super::*;

fn id(text: &str) -> PoolIdentity {
    PoolIdentity::parse(text).unwrap()
}

#[test]
fn identities_are_canonical_and_checked() {
    let a = id("pages=64;device=cuda:0;uuid=GPU-1");
    assert_eq!(a.as_str(), "device=cuda:0;pages=64;uuid=GPU-1");
    assert_eq!(
        a,
        PoolIdentity::new([("uuid", "GPU-1"), ("device", "cuda:0"), ("pages", "64")]).unwrap()
    );
    assert_eq!(a.get("pages"), Some("64"));
    assert_eq!(id("server=a=b").get("server"), Some("a=b"));
    assert_eq!(PoolIdentity::parse(""), Err(IdentityError::Empty));
    assert_eq!(
        PoolIdentity::parse("a=1;;b=2"),
        Err(IdentityError::NotAPair { index: 1 })
    );
    assert_eq!(
        PoolIdentity::parse("junk"),
        Err(IdentityError::NotAPair { index: 0 })
    );
    assert!(matches!(
        PoolIdentity::parse("A=1"),
        Err(IdentityError::BadKey { .. })
    ));
    assert!(matches!(
        PoolIdentity::parse("=1"),
        Err(IdentityError::BadKey { .. })
    ));
    assert!(matches!(
        PoolIdentity::parse("a="),
        Err(IdentityError::BadValue { .. })
    ));
    assert!(matches!(
        PoolIdentity::parse("a=\u{0}"),
        Err(IdentityError::BadValue { .. })
    ));
    assert!(matches!(
        PoolIdentity::parse("a=é"),
        Err(IdentityError::BadValue { .. })
    ));
    assert_eq!(
        PoolIdentity::parse("a=1;a=1"),
        Err(IdentityError::Duplicate { key: "a".into() })
    );
    let long_key = format!("{}=1", "k".repeat(MAX_KEY + 1));
    assert!(matches!(
        PoolIdentity::parse(&long_key),
        Err(IdentityError::BadKey { .. })
    ));
    // The limit is on the canonical form, exactly.
    let fits = format!("k={}", "v".repeat(MAX_POOL_IDENTITY - 2));
    assert_eq!(id(&fits).as_str().len(), MAX_POOL_IDENTITY);
    let over = format!("k={}", "v".repeat(MAX_POOL_IDENTITY - 1));
    assert!(matches!(
        PoolIdentity::parse(&over),
        Err(IdentityError::TooLong { .. })
    ));
    let many = (0..200).map(|i| (format!("k{i}"), "12345".to_owned()));
    assert!(matches!(
        PoolIdentity::new(many),
        Err(IdentityError::TooLong { .. })
    ));
    assert_eq!(
        PoolIdentity::new(Vec::<(&str, &str)>::new()),
        Err(IdentityError::Empty)
    );
}

#[test]
fn differences_name_every_key_that_differs() {
    let a = id("device=cuda:0;pages=64;uuid=GPU-1");
    let b = id("device=cuda:0;pages=32;server=x");
    assert_eq!(
        a.differences(&b),
        vec![
            ("pages", Some("64"), Some("32")),
            ("server", None, Some("x")),
            ("uuid", Some("GPU-1"), None)
        ]
    );
    assert!(a.differences(&a).is_empty());
}

#[test]
fn the_first_binder_sets_the_pool_and_the_last_leaving_frees_it() {
    let board = BindingBoard::default();
    let mut b = Binding::new(&board);
    assert_eq!(board.read(), Ok(None));
    assert_eq!(b.bind(3, "pages=64;device=cpu"), Ok(1));
    // The same buffer, its pairs in another order: one binding.
    assert_eq!(b.bind(5, "device=cpu;pages=64"), Ok(2));
    assert_eq!(
        b.bind(5, "device=cpu;pages=64"),
        Ok(2),
        "binding again changes nothing"
    );
    let shown = board.read().unwrap().unwrap();
    assert_eq!(shown.identity.as_str(), "device=cpu;pages=64");
    assert_eq!(shown.holders, 2);

    let refused = b.bind(7, "device=cpu;pages=32").unwrap_err();
    assert_eq!(refused.kind, ErrorKind::PoolMismatch);
    for needle in [
        "radixd serve --name OTHER",
        "RADIXD_NAME=OTHER",
        "radixd serve --store",
        "pages (bound 64, this client 32)",
    ] {
        assert!(
            refused.message.contains(needle),
            "{needle} not in {}",
            refused.message
        );
    }
    // A holder cannot switch buffers either.
    let switched = b.bind(3, "device=cpu;pages=32").unwrap_err();
    assert_eq!(switched.kind, ErrorKind::PoolMismatch);
    assert!(switched.message.contains("does not change"));
    // Garbage is malformed and changes nothing.
    let garbage = b.bind(7, "not an identity").unwrap_err();
    assert_eq!(garbage.kind, ErrorKind::Malformed);
    let over = format!("k={}", "v".repeat(2 * MAX_POOL_IDENTITY));
    assert_eq!(b.bind(7, &over).unwrap_err().kind, ErrorKind::Malformed);
    assert_eq!(
        (b.holders(), board.read().unwrap().unwrap().holders),
        (2, 2)
    );

    assert_eq!(b.release(7), Released::NotHeld);
    assert_eq!(b.release(3), Released::Held);
    assert_eq!(board.read().unwrap().unwrap().holders, 1);
    assert_eq!(b.release(5), Released::Unbound);
    assert_eq!(b.identity(), None);
    assert_eq!(board.read(), Ok(None));
    // Unbound, any buffer may bind it again.
    assert_eq!(b.bind(7, "device=cpu;pages=32"), Ok(1));
    assert_eq!(
        board.read().unwrap().unwrap().identity.as_str(),
        "device=cpu;pages=32"
    );
}

/// An identity of the size the SGLang backend binds
/// (`radixd.sglang.pool_identity`: a GPU's device and UUID, the pool's
/// geometry, the server).
fn sglang(device: &str, uuid: &str, server: &str) -> String {
    format!(
        "device={device};uuid={uuid};page_size=16;pages=65536;dtype=bfloat16;layers=32;\
         heads=8;head_dim=128;v_head_dim=128;server={server}"
    )
}

#[test]
fn a_refusal_names_every_key_that_differs_whole_then_what_to_do() {
    let board = BindingBoard::default();
    let mut b = Binding::new(&board);
    let (u0, u1) = (
        "GPU-5d1c4f3e-8a9b-2c7d-6e0f-1a2b3c4d5e6f",
        "GPU-77aa0b1c-9d8e-4f3a-b2c1-0e9d8c7b6a59",
    );
    b.bind(0, &sglang("cuda:0", u0, "10.0.0.1:30000")).unwrap();
    let m = b
        .bind(1, &sglang("cuda:1", u1, "10.0.0.1:30001"))
        .unwrap_err()
        .message;
    assert!(m.len() <= crate::wire::MAX_ERROR_MESSAGE, "{}", m.len());
    let uuids = format!("uuid (bound {u0}, this client {u1})");
    let first: [&str; 3] = [
        "device (bound cuda:0, this client cuda:1)",
        "server (bound 10.0.0.1:30000, this client 10.0.0.1:30001)",
        &uuids,
    ];
    for needle in first.into_iter().chain([
        "radixd serve --name OTHER",
        "RADIXD_NAME=OTHER",
        "radixd serve --store SIZE",
    ]) {
        assert!(m.contains(needle), "{needle} not in {m}");
    }
    // What differs comes before the advice.
    assert!(m.find(first[2]) < m.find("One daemon per KV pool"), "{m}");
    let same = ["dtype", "pages", "layers", "heads"];
    assert!(
        same.iter().all(|k| !m.contains(&format!("{k} (bound"))),
        "{m}"
    );
}

#[test]
fn a_refusal_of_the_longest_identities_stays_whole() {
    let board = BindingBoard::default();
    let mut b = Binding::new(&board);
    // Values of 70 bytes in 12 keys each side, all differing; and the
    // most keys an identity holds, none shared.
    let long = |c: char| {
        (0..12)
            .map(|i| format!("key{i}={}", c.to_string().repeat(70)))
            .collect::<Vec<_>>()
            .join(";")
    };
    b.bind(0, &long('a')).unwrap();
    let m = b.bind(1, &long('b')).unwrap_err().message;
    assert!(m.len() <= crate::wire::MAX_ERROR_MESSAGE, "{}", m.len());
    let (a, bb) = ("a".repeat(70), "b".repeat(70));
    for i in 0..12 {
        let item = format!("key{i} (bound {a}, this client {bb})");
        assert!(m.contains(&item), "{item} not in {m}");
    }
    assert!(m.contains("radixd serve --store SIZE"), "{m}");
    assert!(!m.contains("this client bound"), "{m}");

    let many = |p: &str| {
        let mut v = Vec::new();
        let mut len = 0;
        for i in 0.. {
            let pair = format!("{p}{i}=1");
            if len + pair.len() + 1 > MAX_POOL_IDENTITY {
                break;
            }
            len += pair.len() + 1;
            v.push(pair);
        }
        v.join(";")
    };
    let board = BindingBoard::default();
    let mut b = Binding::new(&board);
    b.bind(0, &many("x")).unwrap();
    let m = b.bind(1, &many("y")).unwrap_err().message;
    assert!(m.len() <= crate::wire::MAX_ERROR_MESSAGE, "{}", m.len());
    assert!(m.contains("more key(s)"), "{m}");
    assert!(m.contains("radixd serve --store SIZE"), "{m}");
    // A holder asking for another buffer is told so, whole too.
    let m = b.bind(0, &many("y")).unwrap_err().message;
    assert!(m.len() <= crate::wire::MAX_ERROR_MESSAGE, "{}", m.len());
    assert!(m.contains("does not change"), "{m}");
}

#[test]
fn an_unbound_client_of_a_bound_pool_may_read_and_give_back_only() {
    let board = BindingBoard::default();
    let mut b = Binding::new(&board);
    let fill = [
        Request::Alloc { n: 1 },
        Request::Insert {
            tokens: vec![1],
            pages: vec![0],
            lock: false,
        },
        Request::SessionCommit {
            session: "s".into(),
            tokens: vec![1],
            pages: vec![0],
        },
        Request::AllocState,
        Request::Namespaced {
            ns: "n".into(),
            request: Box::new(Request::Insert {
                tokens: vec![1],
                pages: vec![0],
                lock: true,
            }),
        },
    ];
    let read = [
        Request::Match {
            tokens: vec![1],
            lock: true,
        },
        Request::Lock { handle: 1 },
        Request::Unlock { handle: 1 },
        Request::Free { pages: vec![0] },
        Request::Evict { tokens: 4 },
        Request::Stats,
        Request::SessionRelease {
            session: "s".into(),
        },
    ];
    // Unbound: everyone may do everything.
    for r in fill.iter().chain(&read) {
        assert_eq!(b.admits(9, r), Ok(()), "{r:?}");
    }
    let identity = format!("k={}", "v".repeat(MAX_POOL_IDENTITY - 2));
    b.bind(3, &identity).unwrap();
    for r in &fill {
        let e = b.admits(9, r).unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotPermitted, "{r:?}");
        assert!(
            e.message
                .starts_with(&format!("{} needs a binding", r.name())),
            "{e}"
        );
        assert!(e.message.contains("\"op\":\"bind\""), "{e}");
        assert!(
            e.message.len() <= crate::wire::MIN_REPLY_WINDOW,
            "{}",
            e.message.len()
        );
        // The holder may.
        assert_eq!(b.admits(3, r), Ok(()), "{r:?}");
    }
    for r in &read {
        assert_eq!(b.admits(9, r), Ok(()), "{r:?}");
    }
    b.release(3);
    assert_eq!(b.admits(9, &fill[0]), Ok(()));
}

#[test]
fn a_garbled_board_is_refused_not_trusted() {
    let board = BindingBoard::default();
    board.publish(Some("a=1"), 1);
    // Relaxed: one thread.
    board
        .len
        .store(MAX_POOL_IDENTITY as u64 + 1, Ordering::Relaxed);
    assert_eq!(board.read(), Err(BoardError::Garbled));
    board.len.store(2, Ordering::Relaxed);
    assert_eq!(
        board.read(),
        Err(BoardError::Garbled),
        "\"a=\" is no identity"
    );
    board.version.begin();
    assert_eq!(board.read(), Err(BoardError::Changing));
}
