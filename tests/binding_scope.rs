//! What a pool binding covers, through real daemons (`radixd exec
//! --connect`, `radixd stat`, `radixd::Client`): nothing cached under one
//! binding (or under none) is ever matched under another, whatever locks a
//! client that never bound holds, whose handles are `stale` afterwards; an
//! unbound client of a bound pool may read, lock, give back and evict, but
//! not fill the pool (`not_permitted`, naming `bind`); and the refusals
//! that name what to do arrive whole: a `pool_mismatch` between identities
//! of the SGLang backend's size names every key that differs, values
//! whole, and a `desync` names the first token where two keys differ.

mod common;

use std::time::{Duration, Instant};

use common::{assert_mentions, radixd, stdout_ok, Daemon, Exec, PUBLISH_DEADLINE};
use radixd::op::ErrorKind;
use radixd::{Client, ClientError, PoolIdentity};
use serde_json::{json, Value};

/// How long the daemon may take to notice a client is gone.
const DEADLINE: Duration = Duration::from_secs(5);

fn stat(name: &str) -> String {
    stdout_ok(
        &radixd()
            .args(["stat", name, "--interval", "0.01"])
            .output()
            .unwrap(),
    )
}

/// Waits until `radixd stat` shows every one of `lines` (its figures are
/// published between the daemon's rounds).
fn wait_for_stat(name: &str, lines: &[&str]) -> String {
    let start = Instant::now();
    loop {
        let out = stat(name);
        if lines.iter().all(|l| out.contains(l)) {
            return out;
        }
        assert!(start.elapsed() < DEADLINE, "{lines:?} not in:\n{out}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the pool shows `want` (its identity's canonical form).
fn wait_for_binding(client: &Client, want: Option<&str>) {
    let start = Instant::now();
    loop {
        let b = client.pool_binding().unwrap();
        if b.as_ref().map(|b| b.identity.as_str()) == want {
            return;
        }
        assert!(start.elapsed() < DEADLINE, "still {b:?}, not {want:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn rejected(e: ClientError) -> radixd::op::Rejection {
    match e {
        ClientError::Rejected(r) => r,
        e => panic!("expected a rejection, got {e:?}"),
    }
}

fn error(answer: &Value) -> (&str, &str) {
    (
        answer["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{answer}")),
        answer["message"].as_str().unwrap_or(""),
    )
}

const KEY: std::ops::Range<u32> = 100..132;

/// Issue 37, item 1, as reported: A binds `cuda:0` and caches 32 tokens, U
/// (never bound) locks them, A closes, B binds `cuda:1` and matches. B
/// must match nothing, and U's lock is a stale handle.
#[test]
fn a_prefix_cached_under_one_binding_is_never_matched_under_another() {
    let daemon = Daemon::start(&["--page-size", "16", "--capacity", "64"]);
    let watcher = Client::connect(&daemon.name).unwrap();
    let tokens: Vec<u32> = KEY.collect();

    let mut a = Exec::start(&["--connect", &daemon.name]);
    let bound = a.call(json!({"op":"bind","pool":"device=cuda:0;server=h:1"}));
    assert_eq!(bound, json!({"ok":true,"holders":1}));
    let pages = a.call(json!({"op":"alloc","n":2}))["pages"].clone();
    assert_eq!(pages.as_array().map(Vec::len), Some(2), "{pages}");
    let r = a.call(json!({"op":"insert","tokens":tokens,"pages":pages}));
    assert_eq!(r["ok"], true, "{r}");

    // U never binds: it may read and lock what A cached.
    let mut u = Exec::start(&["--connect", &daemon.name]);
    let m = u.call(json!({"op":"match","tokens":tokens,"lock":true}));
    assert_eq!((m["len"].as_u64(), &m["pages"]), (Some(32), &pages), "{m}");
    let handle = m["handle"].as_u64().expect("a locked handle");
    wait_for_stat(&daemon.name, &["tokens      32 cached, 32 locked"]);

    // A closes: the binding goes, and U's lock does not keep its prefix.
    drop(a);
    wait_for_binding(&watcher, None);
    wait_for_stat(
        &daemon.name,
        &[
            "pool        not bound",
            "tokens      0 cached, 0 locked",
            "pages       64 free",
        ],
    );

    let mut b = Exec::start(&["--connect", &daemon.name]);
    let bound = b.call(json!({"op":"bind","pool":"device=cuda:1;server=h:2"}));
    assert_eq!(bound, json!({"ok":true,"holders":1}));
    let m = b.call(json!({"op":"match","tokens":tokens,"lock":false}));
    assert_eq!(
        (m["ok"].as_bool(), m["len"].as_u64()),
        (Some(true), Some(0)),
        "{m}"
    );
    assert_eq!(m["pages"], json!([]), "{m}");

    // U's lock is a stale handle now, for unlock and lock alike.
    for op in ["unlock", "lock"] {
        let answer = u.call(json!({"op":op,"handle":handle}));
        assert_eq!(error(&answer).0, "stale_handle", "{op}: {answer}");
    }

    // B's own cache works as on a fresh daemon.
    let pages = b.call(json!({"op":"alloc","n":2}))["pages"].clone();
    let r = b.call(json!({"op":"insert","tokens":tokens,"pages":pages}));
    assert_eq!(
        (r["cached"].as_u64(), r["len"].as_u64()),
        (Some(0), Some(32)),
        "{r}"
    );
    assert_eq!(b.call(json!({"op":"validate"}))["ok"], true);
}

/// What an unbound client may do while a pool is bound, and that a
/// binding starts from an empty tree.
#[test]
fn an_unbound_client_reads_a_bound_pool_but_never_fills_it() {
    let daemon = Daemon::start(&["--page-size", "4", "--capacity", "16"]);
    let pool = PoolIdentity::parse("device=cuda:0;server=h:1").unwrap();
    let mut u = Client::connect(&daemon.name).unwrap();

    // Unbound pool: U may do everything, as before bindings.
    let owned = u.alloc(1).unwrap();
    let cached = u.alloc(2).unwrap();
    u.insert(&[1, 2, 3, 4, 5, 6, 7, 8], &cached, false).unwrap();
    let held = u.match_prefix(&[1, 2, 3, 4, 5, 6, 7, 8], true).unwrap();
    assert_eq!(held.len, 8);
    let held = held.handle.expect("a lock");

    // The first binder starts from an empty tree: what U cached under no
    // buffer is gone, its lock with it; the page it owns stays its own.
    let mut a = Client::connect_bound(&daemon.name, &pool).unwrap();
    assert_eq!(
        a.match_prefix(&[1, 2, 3, 4, 5, 6, 7, 8], false)
            .unwrap()
            .len,
        0
    );
    // The evicted pages pass through limbo until the daemon's next reclaim.
    common::wait_for(PUBLISH_DEADLINE, || match a.stats().unwrap().0 {
        s if (
            s.total_tokens,
            s.protected_tokens,
            s.owned_pages,
            s.free_pages,
        ) == (0, 0, 1, 15) =>
        {
            Ok(())
        }
        s => Err(format!("{s:?}")),
    });
    assert_eq!(
        rejected(u.unlock(held).unwrap_err()).kind,
        ErrorKind::StaleHandle
    );

    // Bound: U may not fill the pool, and nothing changes.
    let pages = a.alloc(2).unwrap();
    a.insert(&[9, 9, 9, 9, 8, 8, 8, 8], &pages, false).unwrap();
    let refused = rejected(u.alloc(1).unwrap_err());
    assert_eq!(refused.kind, ErrorKind::NotPermitted);
    assert_mentions(
        &refused.message,
        &[
            "alloc needs a binding",
            "\"op\":\"bind\"",
            "Client::bind",
            "radixd.Client(name, pool=...)",
            "Bound to: device=cuda:0;server=h:1",
        ],
    );
    let refused = rejected(u.insert(&[5, 5, 5, 5], &owned, false).unwrap_err());
    assert_eq!(refused.kind, ErrorKind::NotPermitted);
    assert!(
        refused.message.starts_with("insert needs a binding"),
        "{refused}"
    );
    let mut exec = Exec::start(&["--connect", &daemon.name]);
    for op in [
        json!({"op":"alloc","n":1}),
        json!({"op":"insert","tokens":[5,5,5,5],"pages":[0]}),
        json!({"op":"session_commit","session":"s","tokens":[5,5,5,5],"pages":[0]}),
        json!({"op":"insert","tokens":[5,5,5,5],"pages":[0],"ns":"n"}),
    ] {
        let answer = exec.call(op.clone());
        let (kind, message) = error(&answer);
        assert_eq!(kind, "not_permitted", "{op}: {answer}");
        assert!(message.contains("bind"), "{answer}");
    }
    let s = a.stats().unwrap().0;
    assert_eq!(
        (s.total_tokens, s.owned_pages, s.free_pages),
        (8, 1, 13),
        "nothing changed"
    );

    // It may read, lock, give back and evict.
    let m = u.match_prefix(&[9, 9, 9, 9, 8, 8, 8, 8], true).unwrap();
    assert_eq!((m.len, &m.pages), (8, &pages));
    assert_eq!(a.stats().unwrap().0.protected_tokens, 8);
    u.unlock(m.handle.unwrap()).unwrap();
    u.free(&owned).unwrap();
    assert_eq!(u.evict(4).unwrap(), 4);
    u.validate().unwrap();

    // A client bound to the same buffer may fill it.
    let mut same = Client::connect_bound(&daemon.name, &pool).unwrap();
    let p = same.alloc(1).unwrap();
    same.insert(&[7, 7, 7, 7], &p, false).unwrap();

    // The pool unbound again, U may fill it again.
    drop(a);
    drop(same);
    wait_for_binding(&u, None);
    let p = u.alloc(1).unwrap();
    u.insert(&[6, 6, 6, 6], &p, false).unwrap();
    assert_eq!(u.match_prefix(&[7, 7, 7, 7], false).unwrap().len, 0);
}

/// An identity of the size the SGLang backend binds
/// (`radixd.sglang.pool_identity`): device, GPU UUID, geometry, server.
fn sglang(device: &str, uuid: &str, server: &str) -> PoolIdentity {
    PoolIdentity::new([
        ("device", device),
        ("uuid", uuid),
        ("page_size", "16"),
        ("pages", "65536"),
        ("dtype", "bfloat16"),
        ("layers", "32"),
        ("heads", "8"),
        ("head_dim", "128"),
        ("v_head_dim", "128"),
        ("server", server),
    ])
    .unwrap()
}

/// Issue 37, item 2: the refusal between two such identities, through the
/// daemon and `exec`, names every key that differs with both values whole,
/// then what to do.
#[test]
fn a_pool_mismatch_of_sglang_sized_identities_arrives_whole() {
    let daemon = Daemon::start(&["--page-size", "16", "--capacity", "64"]);
    let (u0, u1) = (
        "GPU-5d1c4f3e-8a9b-2c7d-6e0f-1a2b3c4d5e6f",
        "GPU-77aa0b1c-9d8e-4f3a-b2c1-0e9d8c7b6a59",
    );
    let first = sglang("cuda:0", u0, "10.1.2.3:30000");
    let second = sglang("cuda:1", u1, "10.1.2.3:30001");
    assert!(first.as_str().len() > 150, "{first}");
    let _a = Client::connect_bound(&daemon.name, &first).unwrap();
    let refused = rejected(Client::connect_bound(&daemon.name, &second).err().unwrap());
    assert_eq!(refused.kind, ErrorKind::PoolMismatch);
    let uuid = format!("uuid (bound {u0}, this client {u1})");
    let whole = [
        "device (bound cuda:0, this client cuda:1)",
        "server (bound 10.1.2.3:30000, this client 10.1.2.3:30001)",
        &uuid,
        "radixd serve --name OTHER",
        "RADIXD_NAME=OTHER",
        "(`radixd serve --store SIZE`).",
    ];
    assert_mentions(&refused.message, &whole);
    assert!(
        refused.message.ends_with("(`radixd serve --store SIZE`)."),
        "{refused}"
    );

    let mut exec = Exec::start(&["--connect", &daemon.name]);
    let answer = exec.call(json!({"op":"bind","pool":second.as_str()}));
    let (kind, message) = error(&answer);
    assert_eq!(kind, "pool_mismatch");
    assert_eq!(message, refused.message);
}

fn rank(name: &str, r: u32) -> Client {
    let mut c = Client::connect(name).unwrap();
    c.join("tp", r, 2).unwrap();
    c
}

/// Issue 37, item 2: two keys of one length that differ at token 9 read
/// the same in their first 4 tokens; the `desync` names token 9.
#[test]
fn a_desync_names_the_first_token_where_the_keys_differ() {
    let daemon = Daemon::start(&["--page-size", "4", "--capacity", "32"]);
    let (mut r0, mut r1) = (rank(&daemon.name, 0), rank(&daemon.name, 1));
    let led: Vec<u32> = (0..16).collect();
    let mut ours = led.clone();
    ours[9] = 900;
    assert_eq!(r0.match_prefix(&led, false).unwrap().len, 0);
    let err = rejected(r1.match_prefix(&ours, false).unwrap_err());
    assert_eq!(err.kind, ErrorKind::Desync);
    assert_mentions(
        &err.message,
        &[
            "rank 1 of group \"tp\" is out of step at step 0",
            "the keys first differ at token 9 (from 0): 900 here, 9 at rank 0",
            "it sent match of 16 tokens [0, 1, 2, 3, ...] where rank 0 sent match of 16 tokens [0, 1, 2, 3, ...]",
        ],
    );
    // What differs comes first.
    let at = err.message.find("token 9").unwrap();
    assert!(at < err.message.find("it sent").unwrap(), "{err}");
}

/// Item 1 with the hybrid components on: an unbound client's lock holds a
/// node's SWA pages or its MAMBA state too; the binding's end frees them
/// all the same, and the lock's handle (with SWA, the lock's own receipt)
/// is stale.
#[test]
fn a_hybrid_prefix_never_outlives_its_pool_either() {
    for (args, free) in [
        (
            ["--components", "full,swa", "--swa-window", "4"],
            "swa         window 4 tokens; 16 of 16 pages free; 0 tokens evictable, 0 locked",
        ),
        (
            ["--components", "full,mamba", "--mamba-capacity", "4"],
            "mamba       4 of 4 states free; 0 evictable, 0 locked",
        ),
    ] {
        let mamba = args[1] == "full,mamba";
        let mut all = vec!["--page-size", "4", "--capacity", "16"];
        all.extend(args);
        let daemon = Daemon::start(&all);
        let watcher = Client::connect(&daemon.name).unwrap();
        let tokens: Vec<u32> = (1..=8).collect();

        let mut a = Exec::start(&["--connect", &daemon.name]);
        let bound = a.call(json!({"op":"bind","pool":"device=cuda:0;server=h:1"}));
        assert_eq!(bound["ok"], true, "{bound}");
        let pages = a.call(json!({"op":"alloc","n":2}))["pages"].clone();
        let mut insert = json!({"op":"insert","tokens":tokens,"pages":pages});
        if mamba {
            let state = a.call(json!({"op":"alloc_state"}))["state"].clone();
            insert["mamba_state"] = state;
        }
        let r = a.call(insert);
        assert_eq!(r["ok"], true, "{r}");

        let mut u = Exec::start(&["--connect", &daemon.name]);
        let m = u.call(json!({"op":"match","tokens":tokens,"lock":true}));
        assert_eq!(m["len"].as_u64(), Some(8), "{m}");
        let handle = m["handle"].as_u64().expect("a locked handle");

        drop(a);
        wait_for_binding(&watcher, None);
        wait_for_stat(
            &daemon.name,
            &[
                "tokens      0 cached, 0 locked",
                "pages       16 free",
                free,
            ],
        );
        let mut b = Exec::start(&["--connect", &daemon.name]);
        let bound = b.call(json!({"op":"bind","pool":"device=cuda:1;server=h:2"}));
        assert_eq!(bound["ok"], true, "{bound}");
        let m = b.call(json!({"op":"match","tokens":tokens,"lock":false}));
        assert_eq!(m["len"].as_u64(), Some(0), "{args:?}: {m}");
        let answer = u.call(json!({"op":"unlock","handle":handle}));
        assert_eq!(error(&answer).0, "stale_handle", "{args:?}: {answer}");
        assert_eq!(b.call(json!({"op":"validate"}))["ok"], true);
    }
}
