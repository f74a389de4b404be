//! One daemon, one KV pool, through the real daemon: the first client that
//! binds a KV buffer binds the pool, a client of another buffer is refused
//! (`pool_mismatch`, with what to do), clients that bind nothing read
//! beside it, garbage changes nothing, and the binding goes with its last
//! holder (disconnected or SIGKILLed), its cached prefixes with it, so a
//! restarted server binds again. `radixd stat` shows it all.

mod common;

use std::time::{Duration, Instant};

use common::{assert_mentions, radixd, stdout_ok, Daemon, Exec, PUBLISH_DEADLINE};
use radixd::binding::MAX_POOL_IDENTITY;
use radixd::op::{ErrorKind, Request};
use radixd::{Client, ClientError, PoolIdentity};
use serde_json::json;

/// How long the daemon may take to notice a client is gone.
const RELEASE_DEADLINE: Duration = Duration::from_secs(2);

fn gpu(uuid: &str, pages: u32) -> PoolIdentity {
    PoolIdentity::new([
        ("device", "cuda:0".to_owned()),
        ("uuid", uuid.to_owned()),
        ("page_size", "4".to_owned()),
        ("pages", pages.to_string()),
        ("dtype", "bfloat16".to_owned()),
        ("server", "127.0.0.1:30000".to_owned()),
    ])
    .unwrap()
}

fn stat(name: &str) -> String {
    stdout_ok(
        &radixd()
            .args(["stat", name, "--interval", "0.01"])
            .output()
            .unwrap(),
    )
}

fn mismatch(e: ClientError) -> String {
    match e {
        ClientError::Rejected(r) if r.kind == ErrorKind::PoolMismatch => r.message,
        e => panic!("expected pool_mismatch, got {e:?}"),
    }
}

/// Waits until the pool shows `want` (identity, holders).
fn wait_for(client: &Client, want: Option<(&PoolIdentity, u64)>) {
    let start = Instant::now();
    loop {
        let b = client.pool_binding().unwrap();
        if b.as_ref().map(|b| (&b.identity, b.holders)) == want {
            return;
        }
        assert!(
            start.elapsed() < RELEASE_DEADLINE,
            "still {b:?}, not {want:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_bound_pool_refuses_another_buffer_and_is_freed_by_its_last_holder() {
    let daemon = Daemon::start(&["--page-size", "4", "--capacity", "64"]);
    let (a, b) = (gpu("GPU-aaaa", 64), gpu("GPU-bbbb", 64));
    assert_mentions(&stat(&daemon.name), &["pool        not bound"]);

    let first = Client::connect_bound(&daemon.name, &a).unwrap();
    // The same buffer, said in another order: one binding.
    let same = PoolIdentity::parse(&a.as_str().split(';').rev().collect::<Vec<_>>().join(";"));
    let mut second = Client::connect_bound(&daemon.name, &same.unwrap()).unwrap();
    assert_eq!(second.bind(&a).unwrap(), 2, "binding again changes nothing");
    wait_for(&first, Some((&a, 2)));

    let refused = mismatch(Client::connect_bound(&daemon.name, &b).err().unwrap());
    assert_mentions(
        &refused,
        &[
            "another KV buffer",
            "radixd serve --name OTHER",
            "RADIXD_NAME=OTHER",
            "node-wide store",
            "radixd serve --store",
            "uuid (bound GPU-aaaa, this client GPU-bbbb)",
        ],
    );
    assert_mentions(
        &stat(&daemon.name),
        &[&format!("pool        bound to {a} (2 clients bound)")],
    );

    // A client that binds nothing reads beside the binding (filling the
    // pool is for binders: tests/binding_scope.rs).
    let mut guest = Client::connect(&daemon.name).unwrap();
    let pages = second.alloc(2).unwrap();
    second
        .insert(&[1, 2, 3, 4, 5, 6, 7, 8], &pages, false)
        .unwrap();
    assert_eq!(
        guest
            .match_prefix(&[1, 2, 3, 4, 5, 6, 7, 8], false)
            .unwrap()
            .len,
        8
    );

    // Garbage and over-long identities: malformed, nothing changes (the
    // guest stays unbound, the binding as it was).
    let over = format!("k={}", "v".repeat(MAX_POOL_IDENTITY));
    let huge = "x".repeat(64 << 10);
    for bad in [
        "garbage", "", "a=1;;b=2", "Device=x", "a=1;a=1", "a=\u{7f}", &over, &huge,
    ] {
        match guest.call(&Request::Bind {
            pool: bad.to_owned(),
        }) {
            Err(ClientError::Rejected(r)) => {
                assert_eq!(r.kind, ErrorKind::Malformed, "{bad:.40}: {r}")
            }
            other => panic!("{bad:.40}: {other:?}"),
        }
    }
    wait_for(&guest, Some((&a, 2)));
    guest.validate().unwrap();

    // The holders leave: the binding goes with the last, and the cached
    // prefixes with it (their KV lived in that buffer).
    drop(first);
    wait_for(&guest, Some((&a, 1)));
    drop(second);
    wait_for(&guest, None);
    assert_eq!(
        guest
            .match_prefix(&[1, 2, 3, 4, 5, 6, 7, 8], false)
            .unwrap()
            .len,
        0
    );
    // Every page comes back: those evicted with the tree pass through limbo
    // (readers might hold them) until the daemon's next reclaim.
    common::wait_for(PUBLISH_DEADLINE, || match guest.stats().unwrap().0 {
        s if s.free_pages == 64 => Ok(()),
        s => Err(format!("{s:?}")),
    });
    assert_mentions(&stat(&daemon.name), &["pool        not bound"]);

    // Another buffer binds it now.
    let _other = Client::connect_bound(&daemon.name, &b).unwrap();
    wait_for(&guest, Some((&b, 1)));
    assert_mentions(
        &stat(&daemon.name),
        &[&format!("pool        bound to {b} (1 client bound)")],
    );
    guest.validate().unwrap();
}

#[test]
fn a_killed_binder_releases_the_pool_and_a_restarted_server_binds_again() {
    let daemon = Daemon::start(&["--page-size", "4", "--capacity", "64"]);
    let (a, b) = (gpu("GPU-aaaa", 64), gpu("GPU-aaaa", 32));
    let watcher = Client::connect(&daemon.name).unwrap();

    let mut server = Exec::start(&["--connect", &daemon.name]);
    let bound = server.call(json!({"op":"bind","pool":a.as_str()}));
    assert_eq!(bound, json!({"ok":true,"holders":1}));
    let pages = server.call(json!({"op":"alloc","n":2}))["pages"].clone();
    let r =
        server.call(json!({"op":"insert","tokens":[1,2,3,4,5,6,7,8],"pages":pages,"lock":true}));
    assert_eq!(r["ok"], true, "{r}");
    let refused = mismatch(Client::connect_bound(&daemon.name, &b).err().unwrap());
    assert_mentions(&refused, &["pages (bound 64, this client 32)"]);
    // Through exec, the same refusal.
    let mut other = Exec::start(&["--connect", &daemon.name]);
    let answer = other.call(json!({"op":"bind","pool":b.as_str()}));
    assert_eq!(answer["error"], "pool_mismatch", "{answer}");

    server.kill(libc::SIGKILL);
    wait_for(&watcher, None);
    // Its locked prefix was released with it, then dropped with the pool.
    // (Its pages pass through limbo until the daemon's next reclaim.)
    let mut probe = Client::connect(&daemon.name).unwrap();
    common::wait_for(PUBLISH_DEADLINE, || match probe.stats().unwrap().0 {
        s if (s.total_tokens, s.free_pages, s.protected_tokens) == (0, 64, 0) => Ok(()),
        s => Err(format!("{s:?}")),
    });

    // The restarted server (or another one) binds again.
    let answer = other.call(json!({"op":"bind","pool":b.as_str()}));
    assert_eq!(answer, json!({"ok":true,"holders":1}));
    assert_mentions(
        &stat(&daemon.name),
        &[&format!("pool        bound to {b} (1 client bound)")],
    );
}

#[test]
fn an_in_process_engine_has_no_pool_to_bind() {
    let mut exec = Exec::start(&["--page-size", "4", "--capacity", "8"]);
    let answer = exec.call(json!({"op":"bind","pool":"device=cpu"}));
    assert_eq!(answer["error"], "not_permitted", "{answer}");
    let answer = exec.call(json!({"op":"bind","pool":7}));
    assert_eq!(answer["error"], "malformed", "{answer}");
}
