//! `radixd exec`: the JSON-lines interface the README documents, driven through the
//! real binary one line at a time (which also proves answers are flushed
//! before the next request is read). Every scenario runs three times: on
//! the in-process engine, and with `--connect` through a real daemon, once
//! with anchored match and insert (the default) and once with
//! `--full-requests`; the answers must be the same. Each also runs with
//! `--components full,swa` (no SWA pressure: every answer is the
//! full-only one plus its hybrid fields) and, where the MAMBA match rule
//! (a match ends at a node holding a state) leaves the answers alone,
//! `--components full,mamba`, in-process and through a daemon (anchored
//! and with `--full-requests`).

mod common;

use common::{error_kind, refused, Daemon, Exec, Hybrid};
use serde_json::{json, Value};

/// The flags of a configuration with a secondary component.
fn component_args(component: Hybrid) -> Vec<String> {
    let a: &[&str] = match component {
        // A window longer than any key: SWA splits a new leaf one window
        // from its end (SGLang's `_maybe_split_leaf_for_swa_lock`), which
        // would change the node counts the scenarios check.
        Hybrid::Swa => &["--components", "full,swa", "--swa-window", "8192"],
        Hybrid::Mamba => &["--components", "full,mamba", "--mamba-capacity", "16"],
    };
    a.iter().map(|s| s.to_string()).collect()
}

/// `$scenario` with `component` on: in-process and through a daemon.
macro_rules! hybrid {
    ($scenario:ident, $args:ident, $component:expr) => {
        #[test]
        fn in_process() {
            let mut a = super::$args();
            a.extend(component_args($component));
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            super::super::$scenario(&mut Exec::start(&a).hybrid($component));
        }

        #[test]
        fn through_the_daemon() {
            let mut a = super::$args();
            a.extend(component_args($component));
            let mut a: Vec<&str> = a.iter().map(String::as_str).collect();
            a.push("--allow-reset");
            let daemon = Daemon::start(&a);
            let x = Exec::start(&["--connect", &daemon.name]);
            super::super::$scenario(&mut x.hybrid($component));
        }

        #[test]
        fn through_the_daemon_with_full_requests() {
            let mut a = super::$args();
            a.extend(component_args($component));
            let mut a: Vec<&str> = a.iter().map(String::as_str).collect();
            a.push("--allow-reset");
            let daemon = Daemon::start(&a);
            let x = Exec::start(&["--connect", &daemon.name, "--full-requests"]);
            super::super::$scenario(&mut x.hybrid($component));
        }
    };
}

/// Runs `$scenario(&mut Exec)` against every backend.
macro_rules! both {
    ($scenario:ident, $page_size:expr, $capacity:expr) => {
        both!($scenario, $page_size, $capacity, {
            mod mamba {
                use super::*;
                hybrid!($scenario, args, Hybrid::Mamba);
            }
        });
    };
    ($scenario:ident, $page_size:expr, $capacity:expr, swa) => {
        both!($scenario, $page_size, $capacity, {});
    };
    ($scenario:ident, $page_size:expr, $capacity:expr, { $($extra:tt)* }) => {
        mod $scenario {
            use super::*;

            mod swa {
                use super::*;
                hybrid!($scenario, args, Hybrid::Swa);
            }

            $($extra)*

            fn args() -> Vec<String> {
                let (p, c): (u32, u32) = ($page_size, $capacity);
                vec![
                    "--page-size".into(),
                    p.to_string(),
                    "--capacity".into(),
                    c.to_string(),
                ]
            }

            #[test]
            fn in_process() {
                let a = args();
                let a: Vec<&str> = a.iter().map(String::as_str).collect();
                super::$scenario(&mut Exec::start(&a));
            }

            #[test]
            fn through_the_daemon() {
                let a = args();
                let mut a: Vec<&str> = a.iter().map(String::as_str).collect();
                a.push("--allow-reset"); // the scenarios reset, as in-process
                let daemon = Daemon::start(&a);
                super::$scenario(&mut Exec::start(&["--connect", &daemon.name]));
            }

            #[test]
            fn through_the_daemon_with_full_requests() {
                let a = args();
                let mut a: Vec<&str> = a.iter().map(String::as_str).collect();
                a.push("--allow-reset");
                let daemon = Daemon::start(&a);
                let name = daemon.name.as_str();
                super::$scenario(&mut Exec::start(&["--connect", name, "--full-requests"]));
            }
        }
    };
}

// Those whose matches end inside an edge or at a node without a state
// answer otherwise under MAMBA: they run full-only and with SWA.
both!(every_op_answers_as_the_design_says, 2, 8, swa);
both!(sessions_over_exec, 2, 16);
both!(errors_are_typed_and_change_nothing, 1, 4, swa);
both!(unknown_fields_are_refused_by_name, 1, 4);
both!(session_ids_follow_one_rule, 2, 8);
both!(shared_prefixes_split_dedupe_and_extend, 2, 16, swa);
both!(evictions_of_any_size_answer_alike, 1, 4500);

/// An `evict` and an `alloc` much larger than a quarter of the pool, past
/// thousands of locked nodes: a daemon answers them exactly as the
/// in-process engine does (its limbo has no capacity of its own).
fn evictions_of_any_size_answer_alike(x: &mut Exec) {
    let pages = x.call(json!({"op":"alloc","n":4500}))["pages"].clone();
    let pages: Vec<u64> = serde_json::from_value(pages).expect("pages");
    assert_eq!(pages.len(), 4500);
    // 3,000 locked one-token prompts, then 1,500 unlocked ones after them.
    for (i, &page) in pages.iter().enumerate() {
        let lock = i < 3000;
        let answer = x.call(json!({"op":"insert","tokens":[i],"pages":[page],"lock":lock}));
        assert_eq!(answer["ok"], json!(true), "{answer}");
    }
    assert_eq!(
        x.call(json!({"op":"evict","tokens":15000})),
        json!({"ok":true,"evicted":1500})
    );
    let stats = x.call(json!({"op":"stats"}));
    assert_eq!(
        (
            &stats["free_pages"],
            &stats["protected_tokens"],
            &stats["evict_scanned"]
        ),
        (&json!(1500), &json!(3000), &json!(1500)),
        "{stats}"
    );
    // Fill the pool again, unlocked, and ask for nearly all of it: the
    // alloc evicts 2,999 pages in one request.
    x.call(json!({"op":"reset"}));
    let pages = x.call(json!({"op":"alloc","n":4500}))["pages"].clone();
    let tokens: Vec<u64> = (0..4500).collect();
    let answer = x.call(json!({"op":"insert","tokens":tokens,"pages":pages}));
    assert_eq!(answer, json!({"ok":true,"cached":0,"len":4500}));
    assert_eq!(
        x.call(json!({"op":"alloc","n":1501}))["pages"]
            .as_array()
            .map(Vec::len),
        Some(1501)
    );
    let answer = x.call(json!({"op":"alloc","n":2999}));
    assert_eq!(
        answer["pages"].as_array().map(Vec::len),
        Some(2999),
        "{answer}"
    );
    let stats = x.call(json!({"op":"stats"}));
    assert_eq!(
        (
            &stats["free_pages"],
            &stats["total_tokens"],
            &stats["evict_scanned"]
        ),
        (&json!(0), &json!(0), &json!(2)),
        "{stats}"
    );
}

/// Prompts that share prefixes: matches and inserts that end inside an
/// edge, at its end, past it, with duplicates and with pages the client
/// does not own; the anchored paths must answer exactly the same.
fn shared_prefixes_split_dedupe_and_extend(x: &mut Exec) {
    let call = |x: &mut Exec, v: Value| x.call(v);
    assert_eq!(
        call(x, json!({"op":"alloc","n":4}))["pages"],
        json!([0, 1, 2, 3])
    );
    let base = [1, 2, 3, 4, 5, 6, 7, 8];
    assert_eq!(
        call(x, json!({"op":"insert","tokens":base,"pages":[0,1,2,3]})),
        json!({"ok":true,"cached":0,"len":8})
    );
    // Ends inside the edge: split there, the handle covers 6 tokens.
    let m = call(
        x,
        json!({"op":"match","tokens":[1,2,3,4,5,6,9,9],"lock":true}),
    );
    assert_eq!((&m["len"], &m["pages"]), (&json!(6), &json!([0, 1, 2])));
    let h6 = m["handle"].as_u64().expect("handle");
    // Past the end (an odd token left over), then exactly at an edge's end.
    let m = call(x, json!({"op":"match","tokens":[1,2,3,4,5,6,7,8,9]}));
    assert_eq!((&m["len"], &m["pages"]), (&json!(8), &json!([0, 1, 2, 3])));
    let m = call(x, json!({"op":"match","tokens":[1,2,3,4,5,6],"lock":true}));
    assert_eq!(m["len"], json!(6));
    if x.component() == Some(Hybrid::Swa) {
        // With SWA a lock's handle names the lock (its window): the same
        // node (low 31 bits), another lock.
        let h = m["handle"].as_u64().expect("handle");
        assert_ne!(h, h6);
        assert_eq!(h & 0x7fff_ffff, h6 & 0x7fff_ffff);
    } else {
        assert_eq!(m["handle"], json!(h6));
    }
    // Shorter than a page: nothing, no handle.
    assert_eq!(
        call(x, json!({"op":"match","tokens":[1],"lock":true})),
        json!({"ok":true,"len":0,"pages":[],"handle":null})
    );
    assert_eq!(
        call(x, json!({"op":"alloc","n":3}))["pages"],
        json!([4, 5, 6])
    );
    // Duplicates of the cached prefix go back to the pool; a new leaf
    // hangs under the split node.
    assert_eq!(
        call(
            x,
            json!({"op":"insert","tokens":[1,2,3,4,20,21],"pages":[4,5,6],"lock":true})
        )["cached"],
        json!(4)
    );
    assert_eq!(call(x, json!({"op":"stats"}))["free_pages"], json!(11));
    // Inside an edge again (splits [1,2,3,4] at one page).
    assert_eq!(call(x, json!({"op":"alloc","n":2}))["pages"], json!([7, 8]));
    let ins = call(
        x,
        json!({"op":"insert","tokens":[1,2,30,31],"pages":[0,8],"lock":true}),
    );
    assert_eq!((&ins["cached"], &ins["len"]), (&json!(2), &json!(4)));
    // Errors: a page not owned beyond the cached prefix, wrong counts;
    // nothing changes.
    let before = call(x, json!({"op":"stats"}));
    let bad = call(
        x,
        json!({"op":"insert","tokens":[1,2,3,4,5,6,7,8,9,9],"pages":[0,1,2,3,4]}),
    );
    assert_eq!(error_kind(&bad), "page_not_owned");
    let bad = call(
        x,
        json!({"op":"insert","tokens":[1,2,3,4,5,6,7,8,9,9],"pages":[0,1,2]}),
    );
    assert_eq!(error_kind(&bad), "page_count_mismatch");
    let bad = call(
        x,
        json!({"op":"insert","tokens":[1,2,3,4,5,6,7,8,9,9],"pages":[0,1,2,3,99]}),
    );
    assert_eq!(error_kind(&bad), "page_out_of_range");
    assert_eq!(call(x, json!({"op":"stats"})), before);
    // Extending the whole prompt by a page (owned: page 7).
    let ins = call(
        x,
        json!({"op":"insert","tokens":[1,2,3,4,5,6,7,8,9,9],"pages":[0,1,2,3,7]}),
    );
    assert_eq!(ins, json!({"ok":true,"cached":8,"len":10}));
    let m = call(x, json!({"op":"match","tokens":[1,2,3,4,5,6,7,8,9,9,9]}));
    assert_eq!(
        (&m["len"], &m["pages"]),
        (&json!(10), &json!([0, 1, 2, 3, 7]))
    );
    let stats = call(x, json!({"op":"stats"}));
    assert_eq!(
        (
            &stats["nodes"],
            &stats["protected_tokens"],
            &stats["total_tokens"]
        ),
        (&json!(7), &json!(10), &json!(14))
    );
    assert_eq!(call(x, json!({"op":"validate"})), json!({"ok":true}));
    assert_eq!(
        call(x, json!({"op":"unlock","handle":h6})),
        json!({"ok":true})
    );
    assert_eq!(
        call(x, json!({"op":"unlock","handle":h6})),
        json!({"ok":true})
    );
    assert_eq!(
        error_kind(&call(x, json!({"op":"unlock","handle":h6}))),
        "not_locked"
    );
}

/// Session ids are 1..=256 bytes wherever the request comes from.
fn session_ids_follow_one_rule(x: &mut Exec) {
    let long = "s".repeat(257);
    let longest = "s".repeat(256);
    for op in ["session_status", "session_release"] {
        for bad in ["", long.as_str()] {
            let answer = x.call(json!({"op":op,"session":bad}));
            assert_eq!(error_kind(&answer), "malformed", "{op} {:?}", bad.len());
        }
        let answer = x.call(json!({"op":op,"session":longest}));
        assert_eq!(error_kind(&answer), "unknown_session", "{op}");
    }
    let answer = x.call(json!({"op":"session_commit","session":"","tokens":[],"pages":[]}));
    assert_eq!(error_kind(&answer), "malformed");
    let answer = x.call(json!({"op":"session_commit","session":longest,"tokens":[],"pages":[]}));
    assert_eq!(answer["ok"], true, "{answer}");
}

/// A full session: every op and its exact answer.
fn every_op_answers_as_the_design_says(x: &mut Exec) {
    assert_eq!(
        x.call(json!({"op":"alloc","n":3})),
        json!({"ok":true,"pages":[0,1,2]})
    );
    let ins = x.call(json!({"op":"insert","tokens":[1,2,3,4,5,6,7],"pages":[0,1,2],"lock":true}));
    assert_eq!(
        (ins["ok"].clone(), ins["cached"].clone(), ins["len"].clone()),
        (json!(true), json!(0), json!(6))
    );
    let h = ins["handle"].as_u64().expect("handle when lock");
    let plain = x.call(json!({"op":"insert","tokens":[1,2,3,4,5,6],"pages":[0,1,2],"lock":false}));
    assert_eq!(
        plain,
        json!({"ok":true,"cached":6,"len":6}),
        "no handle without lock"
    );
    let m = x.call(json!({"op":"match","tokens":[1,2,3,4,9,9],"lock":true}));
    assert_eq!(
        (m["len"].clone(), m["pages"].clone()),
        (json!(4), json!([0, 1]))
    );
    let h2 = m["handle"].as_u64().expect("handle");
    assert_ne!(h, h2);
    // Without lock the handle still names the node covering the match
    // (SGLang's `last_node`), for a later `lock`.
    let m3 = x.call(json!({"op":"match","tokens":[1,2,3],"lock":false}));
    assert_eq!(
        (m3["len"].clone(), m3["pages"].clone()),
        (json!(2), json!([0]))
    );
    let h3 = m3["handle"].as_u64().expect("handle without lock");
    assert_eq!(x.call(json!({"op":"lock","handle":h3})), json!({"ok":true}));
    assert_eq!(x.call(json!({"op":"stats"}))["protected_tokens"], json!(6));
    assert_eq!(
        x.call(json!({"op":"unlock","handle":h3})),
        json!({"ok":true})
    );
    assert_eq!(
        x.call(json!({"op":"match","tokens":[9,9],"lock":false})),
        json!({"ok":true,"len":0,"pages":[],"handle":null})
    );
    assert_eq!(
        x.call(json!({"op":"match","tokens":[9,9],"lock":true})),
        json!({"ok":true,"len":0,"pages":[],"handle":null})
    );
    assert_eq!(
        x.call(json!({"op":"unlock","handle":h})),
        json!({"ok":true})
    );
    assert_eq!(
        x.call(json!({"op":"unlock","handle":h2})),
        json!({"ok":true})
    );
    assert_eq!(x.call(json!({"op":"lock","handle":h2})), json!({"ok":true}));
    assert_eq!(
        x.call(json!({"op":"unlock","handle":h2})),
        json!({"ok":true})
    );
    let stats = x.call(json!({"op":"stats"}));
    for (k, v) in [
        ("total_tokens", 6),
        ("evictable_tokens", 6),
        ("protected_tokens", 0),
        ("free_pages", 5),
        ("nodes", 3),
    ] {
        assert_eq!(stats[k], json!(v), "{k} in {stats}");
    }
    assert!(stats["evict_scanned"].is_u64());
    let keys: Vec<&str> = stats
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "ok",
            "total_tokens",
            "evictable_tokens",
            "protected_tokens",
            "free_pages",
            "nodes",
            "evict_scanned",
            "sessions"
        ],
        "the stats answer has exactly the fields the README lists"
    );
    assert_eq!(
        x.call(json!({"op":"evict","tokens":3})),
        json!({"ok":true,"evicted":4})
    );
    assert_eq!(
        x.call(json!({"op":"match","tokens":[1,2,3,4,5,6]}))["len"],
        json!(2)
    );
    assert_eq!(x.call(json!({"op":"free","pages":[]})), json!({"ok":true}));
    assert_eq!(x.call(json!({"op":"reset"})), json!({"ok":true}));
    let stats = x.call(json!({"op":"stats"}));
    assert_eq!(
        (
            stats["total_tokens"].clone(),
            stats["free_pages"].clone(),
            stats["nodes"].clone()
        ),
        (json!(0), json!(8), json!(0))
    );
}

fn sessions_over_exec(x: &mut Exec) {
    let pages = x.call(json!({"op":"alloc","n":3}))["pages"].clone();
    let c = x.call(
        json!({"op":"session_commit","session":"chat-1","tokens":[1,2,3,4,5,6,7],"pages":pages}),
    );
    assert_eq!(c, json!({"ok":true,"cached":0,"len":6}));
    let s = x.call(json!({"op":"session_status","session":"chat-1"}));
    assert_eq!(s["resident_tokens"], json!(6));
    assert_eq!(x.call(json!({"op":"stats"}))["sessions"], json!(1));
    assert_eq!(
        x.call(json!({"op":"evict","tokens":100})),
        json!({"ok":true,"evicted":0})
    );
    assert_eq!(
        x.call(json!({"op":"session_release","session":"chat-1"})),
        json!({"ok":true})
    );
    assert_eq!(
        error_kind(&x.call(json!({"op":"session_status","session":"chat-1"}))),
        "unknown_session"
    );
    assert_eq!(
        error_kind(&x.call(json!({"op":"session_release","session":"nope"}))),
        "unknown_session"
    );
    assert_eq!(
        x.call(json!({"op":"evict","tokens":2})),
        json!({"ok":true,"evicted":2})
    );
}

/// Every error kind, each answered in order and changing nothing.
fn errors_are_typed_and_change_nothing(x: &mut Exec) {
    x.call(json!({"op":"alloc","n":2}));
    x.call(json!({"op":"insert","tokens":[5],"pages":[0]}));
    let before = x.call(json!({"op":"stats"}));
    let cases: Vec<(&[u8], &str)> = vec![
        (b"this is not json", "malformed"),
        (b"[1,2,3]", "malformed"),
        (b"{\"n\":1}", "malformed"),
        (b"{\"op\":7}", "malformed"),
        (b"{\"op\":\"alloc\"}", "malformed"),
        (b"{\"op\":\"alloc\",\"n\":-1}", "malformed"),
        (
            b"{\"op\":\"insert\",\"tokens\":[1],\"pages\":\"x\"}",
            "malformed",
        ),
        (
            b"{\"op\":\"insert\",\"tokens\":[1.5],\"pages\":[1]}",
            "malformed",
        ),
        (
            b"{\"op\":\"insert\",\"tokens\":[4294967296],\"pages\":[1]}",
            "malformed",
        ),
        (
            b"{\"op\":\"match\",\"tokens\":[1],\"lock\":\"yes\"}",
            "malformed",
        ),
        (
            b"{\"op\":\"session_commit\",\"session\":3,\"tokens\":[],\"pages\":[]}",
            "malformed",
        ),
        (b"\xff\xfe{\"op\":\"stats\"}", "malformed"),
        (b"{\"op\":\"compact\"}", "unknown_op"),
        (b"{\"op\":\"stats\",\"verbose\":true}", "malformed"),
        (
            b"{\"op\":\"match\",\"tokens\":[5],\"lok\":true}",
            "malformed",
        ),
        (
            b"{\"op\":\"insert\",\"tokens\":[9],\"pages\":[1],\"extra\":null}",
            "malformed",
        ),
        (b"{\"op\":\"free\",\"pages\":[9]}", "page_out_of_range"),
        (
            b"{\"op\":\"free\",\"pages\":[99999999999]}",
            "page_out_of_range",
        ),
        (b"{\"op\":\"free\",\"pages\":[1,1]}", "page_not_owned"),
        (b"{\"op\":\"free\",\"pages\":[0]}", "page_not_owned"),
        (b"{\"op\":\"free\",\"pages\":[2]}", "page_not_owned"),
        (
            b"{\"op\":\"insert\",\"tokens\":[7,8],\"pages\":[1]}",
            "page_count_mismatch",
        ),
        (
            b"{\"op\":\"insert\",\"tokens\":[7],\"pages\":[0]}",
            "page_not_owned",
        ),
        (b"{\"op\":\"alloc\",\"n\":5}", "insufficient_pages"),
        (b"{\"op\":\"lock\",\"handle\":12345}", "unknown_handle"),
        (b"{\"op\":\"unlock\",\"handle\":0}", "unknown_handle"),
        (
            b"{\"op\":\"session_status\",\"session\":\"x\"}",
            "unknown_session",
        ),
    ];
    for (line, kind) in cases {
        let answer = x.raw(line);
        assert_eq!(
            error_kind(&answer),
            kind,
            "for {}",
            String::from_utf8_lossy(line)
        );
        assert_eq!(
            x.call(json!({"op":"stats"})),
            before,
            "{} changed the state",
            String::from_utf8_lossy(line)
        );
    }
    // A stale handle, and an unlock by a client that never locked.
    let h = x.call(json!({"op":"match","tokens":[5],"lock":true}))["handle"].clone();
    assert_eq!(
        x.call(json!({"op":"unlock","handle":h})),
        json!({"ok":true})
    );
    assert_eq!(
        error_kind(&x.call(json!({"op":"unlock","handle":h}))),
        "not_locked"
    );
    x.call(json!({"op":"evict","tokens":1}));
    assert_eq!(
        error_kind(&x.call(json!({"op":"lock","handle":h}))),
        "stale_handle"
    );
}

/// A field the op does not take is `malformed`, named in the message, and
/// the request is not carried out (it used to be ignored silently).
fn unknown_fields_are_refused_by_name(x: &mut Exec) {
    x.call(json!({"op":"alloc","n":1}));
    let before = x.call(json!({"op":"stats"}));
    for (request, field) in [
        (
            json!({"op":"insert","tokens":[3],"pages":[0],"nss":"a"}),
            "nss",
        ),
        (json!({"op":"match","tokens":[3],"locked":true}), "locked"),
        (json!({"op":"alloc","n":1,"count":1}), "count"),
        (json!({"op":"stats","x":1}), "x"),
    ] {
        let answer = x.call(request.clone());
        assert_eq!(error_kind(&answer), "malformed", "{request}");
        let message = answer["message"].as_str().unwrap_or_default();
        assert!(message.contains(&format!("\"{field}\"")), "{message}");
        assert_eq!(x.call(json!({"op":"stats"})), before, "{request}");
    }
}

#[test]
fn a_batch_on_stdin_gets_one_answer_per_line_in_order() {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = common::radixd()
        .args(["exec", "--page-size", "1", "--capacity", "8"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let input = "{\"op\":\"alloc\",\"n\":1}\n\n{\"op\":\"bogus\"}\nnot json\n{\"op\":\"stats\"}\n";
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines.len(),
        4,
        "blank lines are skipped, every other line answered"
    );
    assert_eq!(lines[0], json!({"ok":true,"pages":[0]}));
    assert_eq!(lines[1]["error"], "unknown_op");
    assert_eq!(lines[2]["error"], "malformed");
    assert_eq!(lines[3]["free_pages"], 7, "one of 8 pages is owned");
}

#[test]
fn bad_configuration_is_refused_with_status_2() {
    for args in [["--page-size", "0"], ["--page-size", "2048"]] {
        let out = common::radixd().arg("exec").args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains("page size"));
    }
}

/// Runs `$scenario(&mut Exec)` in-process and through a daemon, both
/// started with `$args` (the scenario sees every hybrid field).
macro_rules! with_args {
    ($scenario:ident, $args:expr) => {
        mod $scenario {
            use super::*;

            #[test]
            fn in_process() {
                super::$scenario(&mut Exec::start(&$args));
            }

            #[test]
            fn through_the_daemon() {
                let daemon = Daemon::start(&$args);
                super::$scenario(&mut Exec::start(&["--connect", &daemon.name]));
            }

            #[test]
            fn through_the_daemon_with_full_requests() {
                let daemon = Daemon::start(&$args);
                let name = daemon.name.as_str();
                super::$scenario(&mut Exec::start(&["--connect", name, "--full-requests"]));
            }
        }
    };
}

with_args!(
    swa_ops_answer_as_documented,
    [
        "--page-size",
        "2",
        "--capacity",
        "16",
        "--components",
        "full,swa",
        "--swa-window",
        "4"
    ]
);
with_args!(
    mamba_ops_answer_as_documented,
    [
        "--page-size",
        "2",
        "--capacity",
        "8",
        "--components",
        "full,mamba",
        "--mamba-capacity",
        "3"
    ]
);
with_args!(
    component_ops_on_a_full_only_cache,
    ["--page-size", "2", "--capacity", "8"]
);

const P12: [u32; 12] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];

/// `free_swa`, `insert` with `swa_evicted`, a tombstone cutting a match
/// back, `evict` of SWA tokens, the SWA stats, and the errors of both.
fn swa_ops_answer_as_documented(x: &mut Exec) {
    assert_eq!(
        x.call(json!({"op":"alloc","n":4})),
        json!({"ok":true,"pages":[0,1,2,3]})
    );
    assert_eq!(
        x.call(json!({"op":"insert","tokens":&P12[..8],"pages":[0,1,2,3]})),
        json!({"ok":true,"cached":0,"len":8})
    );
    let m = x.call(json!({"op":"match","tokens":&P12[..9]}));
    assert_eq!(
        (&m["len"], &m["pages"], &m["full_kv_hit_length"]),
        (&json!(8), &json!([0, 1, 2, 3]), &json!(8))
    );
    assert!(m.get("mamba_state").is_none(), "{m}");
    let stats = x.call(json!({"op":"stats"}));
    assert_eq!(stats["components"], "full,swa");
    assert_eq!(
        (&stats["swa_evictable_tokens"], &stats["swa_free_pages"]),
        (&json!(8), &json!(12))
    );
    for k in ["swa_protected_tokens", "evict_scanned_swa"] {
        assert_eq!(stats[k], json!(0), "{k}");
    }
    for k in ["mamba_free_states", "mamba_evictable_states"] {
        assert!(stats.get(k).is_none(), "{k} without mamba: {stats}");
    }
    // Page 4's tokens slid out of the window: its SWA page goes, once.
    assert_eq!(
        x.call(json!({"op":"alloc","n":2})),
        json!({"ok":true,"pages":[4,5]})
    );
    assert_eq!(
        x.call(json!({"op":"free_swa","pages":[4]})),
        json!({"ok":true,"freed":1})
    );
    assert_eq!(
        x.call(json!({"op":"free_swa","pages":[4]})),
        json!({"ok":true,"freed":0})
    );
    assert_eq!(x.call(json!({"op":"stats"}))["swa_free_pages"], json!(11));
    // Where each page's sliding-window KV lives (page 4's is gone).
    let paired = x.call(json!({"op":"swa_pages","pages":[0,1,4,5]}));
    let sp = paired["swa_pages"].as_array().expect("swa_pages");
    assert_eq!(sp.len(), 4, "{paired}");
    assert!(
        sp[2].is_null() && sp[0] != sp[1] && sp[3].is_u64(),
        "{paired}"
    );
    assert_eq!(
        error_kind(&x.call(json!({"op":"swa_pages","pages":[99]}))),
        "page_out_of_range"
    );
    let insert = |extra: Value| {
        let mut r = json!({"op":"insert","tokens":P12,"pages":[0,1,2,3,4,5]});
        for (k, v) in extra.as_object().unwrap() {
            r[k] = v.clone();
        }
        r
    };
    refused(
        x,
        &[
            // Misaligned, beyond the key, or contradicting the pairing.
            (insert(json!({"swa_evicted":3})), "swa_mismatch"),
            (insert(json!({"swa_evicted":14})), "swa_mismatch"),
            (insert(json!({"swa_evicted":12})), "swa_mismatch"),
            (insert(json!({"swa_evicted":8})), "swa_mismatch"),
            (insert(json!({})), "swa_mismatch"),
            // MAMBA is off.
            (insert(json!({"mamba_state":0})), "component_off"),
            (json!({"op":"alloc_state"}), "component_off"),
            (json!({"op":"free_state","state":0}), "component_off"),
            (
                json!({"op":"evict","tokens":0,"mamba_states":1}),
                "component_off",
            ),
            (json!({"op":"free_swa","pages":[0]}), "page_not_owned"),
            (json!({"op":"free_swa","pages":[99]}), "page_out_of_range"),
            (json!({"op":"free_swa","pages":"x"}), "malformed"),
            (insert(json!({"swa_evicted":-2})), "malformed"),
        ],
    );
    // The leaf's first page is a tombstone: a match is served only up to
    // the last node whose window holds SWA pages; FULL reaches further.
    let ins = x.call(insert(json!({"swa_evicted":10,"lock":true})));
    assert_eq!((&ins["cached"], &ins["len"]), (&json!(8), &json!(12)));
    let h = ins["handle"].as_u64().expect("handle");
    for (len, full) in [(12, 12), (10, 10)] {
        let m = x.call(json!({"op":"match","tokens":&P12[..len]}));
        assert_eq!(
            (&m["len"], &m["pages"], &m["full_kv_hit_length"]),
            (&json!(8), &json!([0, 1, 2, 3]), &json!(full)),
            "{m}"
        );
    }
    let stats = x.call(json!({"op":"stats"}));
    assert_eq!(
        (
            &stats["swa_evictable_tokens"],
            &stats["swa_protected_tokens"]
        ),
        (&json!(8), &json!(2))
    );
    // SWA eviction takes whole nodes' SWA pages, least recently used
    // first, leaving FULL (locked here) alone.
    assert_eq!(
        x.call(json!({"op":"evict","tokens":0,"swa_tokens":2})),
        json!({"ok":true,"evicted":0,"swa_evicted":4,"mamba_evicted":0})
    );
    assert_eq!(
        x.call(json!({"op":"evict","tokens":4})),
        json!({"ok":true,"evicted":0,"swa_evicted":0,"mamba_evicted":0})
    );
    let stats = x.call(json!({"op":"stats"}));
    assert_eq!(
        (
            &stats["swa_evictable_tokens"],
            &stats["swa_free_pages"],
            &stats["evict_scanned_swa"],
            &stats["total_tokens"]
        ),
        (&json!(4), &json!(13), &json!(2), &json!(12))
    );
    assert_eq!(x.call(json!({"op":"validate"})), json!({"ok":true}));
    assert_eq!(
        x.call(json!({"op":"unlock","handle":h})),
        json!({"ok":true})
    );
    assert_eq!(
        x.call(json!({"op":"evict","tokens":100}))["evicted"],
        json!(12)
    );
    assert_eq!(x.call(json!({"op":"validate"})), json!({"ok":true}));
}

/// `alloc_state`, `insert` with `mamba_state` (and `mamba_exist`), a
/// match ending at the node holding a state, `free_state`, `evict` of
/// states, the MAMBA stats, and the errors of both.
fn mamba_ops_answer_as_documented(x: &mut Exec) {
    x.call(json!({"op":"alloc","n":4}));
    assert_eq!(
        x.call(json!({"op":"alloc_state"})),
        json!({"ok":true,"state":0})
    );
    assert_eq!(
        x.call(json!({"op":"insert","tokens":&P12[..8],"pages":[0,1,2,3],"mamba_state":0})),
        json!({"ok":true,"cached":0,"len":8,"mamba_exist":false})
    );
    let m = x.call(json!({"op":"match","tokens":&P12[..9]}));
    assert_eq!(
        (&m["len"], &m["full_kv_hit_length"], &m["mamba_state"]),
        (&json!(8), &json!(8), &json!(0))
    );
    // No state where the match would end: nothing is served.
    assert_eq!(
        x.call(json!({"op":"match","tokens":&P12[..6],"lock":true})),
        json!({"ok":true,"len":0,"pages":[],"handle":null,"full_kv_hit_length":6,"mamba_state":null})
    );
    let stats = x.call(json!({"op":"stats"}));
    assert_eq!(stats["components"], "full,mamba");
    assert_eq!(
        (
            &stats["mamba_evictable_states"],
            &stats["mamba_protected_states"],
            &stats["mamba_free_states"]
        ),
        (&json!(1), &json!(0), &json!(2))
    );
    assert!(stats.get("swa_free_pages").is_none(), "{stats}");
    assert_eq!(
        x.call(json!({"op":"alloc_state"})),
        json!({"ok":true,"state":1})
    );
    assert_eq!(
        x.call(json!({"op":"alloc_state"})),
        json!({"ok":true,"state":2})
    );
    x.call(json!({"op":"alloc","n":2}));
    refused(
        x,
        &[
            // The tree's state, and slots never handed out.
            (json!({"op":"free_state","state":0}), "state_not_owned"),
            (json!({"op":"free_state","state":99}), "state_not_owned"),
            (
                json!({"op":"insert","tokens":P12,"pages":[0,1,2,3,4,5],"mamba_state":7}),
                "state_not_owned",
            ),
            (
                json!({"op":"insert","tokens":P12,"pages":[0,1,2,3,4,5],"mamba_state":4294967296u64}),
                "state_not_owned",
            ),
            (json!({"op":"free_state"}), "malformed"),
            (
                json!({"op":"insert","tokens":P12,"pages":[0,1,2,3,4,5],"mamba_state":"a"}),
                "malformed",
            ),
            // SWA is off (a state slot must be owned, whatever else).
            (
                json!({"op":"insert","tokens":P12,"pages":[0,1,2,3,4,5],"swa_evicted":2}),
                "component_off",
            ),
            (json!({"op":"free_swa","pages":[5]}), "component_off"),
            (
                json!({"op":"evict","tokens":0,"swa_tokens":1}),
                "component_off",
            ),
        ],
    );
    // The key's node holds a state already: the one given stays the
    // client's (SGLang's scheduler then frees it).
    assert_eq!(
        x.call(json!({"op":"insert","tokens":&P12[..8],"pages":[0,1,2,3],"mamba_state":1})),
        json!({"ok":true,"cached":8,"len":8,"mamba_exist":true})
    );
    assert_eq!(
        x.call(json!({"op":"free_state","state":1})),
        json!({"ok":true})
    );
    assert_eq!(
        error_kind(&x.call(json!({"op":"free_state","state":1}))),
        "state_not_owned"
    );
    assert_eq!(
        x.call(json!({"op":"free_state","state":2})),
        json!({"ok":true})
    );
    assert_eq!(
        error_kind(&x.call(json!({"op":"free_state","state":2}))),
        "state_not_owned"
    );
    // A locked state is not evicted; unlocked, it goes, LRU first.
    let m = x.call(json!({"op":"match","tokens":&P12[..8],"lock":true}));
    assert_eq!(m["mamba_state"], json!(0));
    let h = m["handle"].as_u64().expect("handle");
    let stats = x.call(json!({"op":"stats"}));
    assert_eq!(
        (
            &stats["mamba_protected_states"],
            &stats["mamba_free_states"]
        ),
        (&json!(1), &json!(2))
    );
    assert_eq!(
        x.call(json!({"op":"evict","tokens":0,"mamba_states":2})),
        json!({"ok":true,"evicted":0,"swa_evicted":0,"mamba_evicted":0})
    );
    assert_eq!(
        x.call(json!({"op":"unlock","handle":h})),
        json!({"ok":true})
    );
    // The state sits at a FULL leaf (the match of 6 tokens split [1..8]):
    // the leaf goes whole.
    assert_eq!(
        x.call(json!({"op":"evict","tokens":0,"mamba_states":1})),
        json!({"ok":true,"evicted":2,"swa_evicted":0,"mamba_evicted":1})
    );
    let m = x.call(json!({"op":"match","tokens":&P12[..8]}));
    assert_eq!(
        (&m["len"], &m["full_kv_hit_length"], &m["mamba_state"]),
        (&json!(0), &json!(6), &json!(null))
    );
    let stats = x.call(json!({"op":"stats"}));
    assert_eq!(
        (&stats["mamba_free_states"], &stats["total_tokens"]),
        (&json!(3), &json!(6))
    );
    assert!(stats["evict_scanned_mamba"].as_u64().unwrap() >= 1);
    assert_eq!(x.call(json!({"op":"validate"})), json!({"ok":true}));
}

/// On a full-only cache the component ops fail with `component_off`,
/// changing nothing, and zero component fields leave the answers as
/// they always were.
fn component_ops_on_a_full_only_cache(x: &mut Exec) {
    x.call(json!({"op":"alloc","n":2}));
    refused(
        x,
        &[
            (json!({"op":"alloc_state"}), "component_off"),
            (json!({"op":"free_state","state":0}), "component_off"),
            (json!({"op":"free_swa","pages":[0]}), "component_off"),
            (json!({"op":"swa_pages","pages":[0]}), "component_off"),
            (
                json!({"op":"evict","tokens":2,"swa_tokens":2}),
                "component_off",
            ),
            (
                json!({"op":"evict","tokens":2,"mamba_states":1}),
                "component_off",
            ),
            (
                json!({"op":"insert","tokens":[1,2],"pages":[0],"mamba_state":0}),
                "component_off",
            ),
            (
                json!({"op":"insert","tokens":[1,2],"pages":[0],"swa_evicted":2}),
                "component_off",
            ),
        ],
    );
    assert_eq!(
        x.call(json!({"op":"insert","tokens":[1,2,3,4],"pages":[0,1],"swa_evicted":0,"mamba_state":null})),
        json!({"ok":true,"cached":0,"len":4})
    );
    let m = x.call(json!({"op":"match","tokens":[1,2]}));
    assert_eq!((&m["len"], &m["pages"]), (&json!(2), &json!([0])));
    let keys: Vec<&String> = m.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["ok", "len", "pages", "handle"], "{m}");
    assert_eq!(
        x.call(json!({"op":"evict","tokens":2,"swa_tokens":0,"mamba_states":0})),
        json!({"ok":true,"evicted":2})
    );
    let stats = x.call(json!({"op":"stats"}));
    assert!(stats.get("components").is_none(), "{stats}");
}

#[test]
fn bad_components_are_refused_with_status_2() {
    for args in [
        &["--components", "full,bogus"][..],
        &["--components", "full,swa"],
        &["--components", "full,mamba"],
        &["--swa-window", "4"],
        &["--components", "full,swa", "--swa-window", "0"],
        &["--components", "full,mamba", "--mamba-capacity", "0"],
    ] {
        for cmd in [
            &["exec"][..],
            &["serve", "--name", "radixd-test-never-created"],
        ] {
            let out = common::radixd().args(cmd).args(args).output().unwrap();
            assert_eq!(out.status.code(), Some(2), "{cmd:?} {args:?}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                err.contains("components") || err.contains("swa") || err.contains("mamba"),
                "{cmd:?} {args:?}: {err}"
            );
        }
    }
    // A client may not ask for other components than the daemon's.
    let daemon = Daemon::start(&["--components", "full,mamba", "--mamba-capacity", "4"]);
    let out = common::radixd()
        .args(["exec", "--connect", &daemon.name])
        .args(["--components", "full,swa", "--swa-window", "4"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("disagrees"));
    let full = common::radixd()
        .args(["exec", "--connect", &daemon.name, "--components", "full"])
        .output()
        .unwrap();
    assert_eq!(full.status.code(), Some(2), "full is not the daemon's");
    // The daemon's own components are accepted.
    let mut same = Exec::start(&[
        "--connect",
        &daemon.name,
        "--components",
        "full,mamba",
        "--mamba-capacity",
        "4",
    ]);
    assert_eq!(
        same.call(json!({"op":"alloc_state"})),
        json!({"ok":true,"state":0})
    );
}

/// Issue 29: a split uses only what the match reached (exact recency, the
/// default), or both halves as SGLang's tree does (`--recency sglang`):
/// which leaf a partial eviction takes tells them apart.
fn split_recency(x: &mut Exec, sglang: bool) {
    assert_eq!(
        x.call(json!({"op":"alloc","n":6}))["pages"],
        json!([0, 1, 2, 3, 4, 5])
    );
    x.call(json!({"op":"insert","tokens":[1,2,3,4],"pages":[0,1,2,3]}));
    x.call(json!({"op":"insert","tokens":[9,9],"pages":[4,5]}));
    // Splits [1,2 | 3,4].
    assert_eq!(
        x.call(json!({"op":"match","tokens":[1,2]}))["len"],
        json!(2)
    );
    assert_eq!(
        x.call(json!({"op":"evict","tokens":2})),
        json!({"ok":true,"evicted":2})
    );
    let (long, short) = if sglang { (4, 0) } else { (2, 2) };
    assert_eq!(
        x.call(json!({"op":"match","tokens":[1,2,3,4]}))["len"],
        json!(long)
    );
    assert_eq!(
        x.call(json!({"op":"match","tokens":[9,9]}))["len"],
        json!(short)
    );
}

#[test]
fn recency_is_exact_unless_sglang_is_asked_for() {
    let base = ["--page-size", "1", "--capacity", "8"];
    split_recency(&mut Exec::start(&base), false);
    let mut sglang = base.to_vec();
    sglang.extend(["--recency", "sglang"]);
    split_recency(&mut Exec::start(&sglang), true);
    // A daemon's rule is its own: `serve --recency`; exec --connect
    // refuses the flag.
    let daemon = Daemon::start(&sglang);
    split_recency(&mut Exec::start(&["--connect", &daemon.name]), true);
    let out = common::radixd()
        .args(["exec", "--connect", &daemon.name, "--recency", "exact"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--recency"));
    let daemon = Daemon::start(&base);
    split_recency(&mut Exec::start(&["--connect", &daemon.name]), false);
}

/// `"ns":"NAME"` puts a `match`, `insert` or `session_commit` in a
/// namespace: its prefixes never match another's; an empty or too long
/// name is `bad_namespace` and changes nothing; an op that walks from no
/// root takes no `"ns"`.
fn namespaces_over_exec(x: &mut Exec) {
    let pages = x.call(json!({"op":"alloc","n":4}))["pages"].clone();
    let (a, b) = (json!([pages[0], pages[1]]), json!([pages[2], pages[3]]));
    let ins = |x: &mut Exec, ns: Option<&str>, pages: &Value| {
        let mut r = json!({"op":"insert","tokens":[1,2,3,4],"pages":pages});
        if let Some(ns) = ns {
            r["ns"] = json!(ns);
        }
        x.call(r)
    };
    assert_eq!(ins(x, None, &a)["cached"], 0);
    assert_eq!(ins(x, Some("lora-7"), &b)["cached"], 0, "nothing shared");
    let m = |x: &mut Exec, ns: Value| x.call(json!({"op":"match","tokens":[1,2,3,4,5],"ns":ns}));
    assert_eq!(m(x, Value::Null)["pages"], a);
    assert_eq!(m(x, json!("lora-7"))["pages"], b);
    assert_eq!(m(x, json!("other"))["len"], 0);
    // A session commits in a namespace: the prefix is found there.
    let c = x.call(json!({"op":"alloc","n":2}))["pages"].clone();
    let s = x.call(
        json!({"op":"session_commit","session":"s","tokens":[1,2,3,4],
        "pages":c,"ns":"lora-7"}),
    );
    assert_eq!(s["cached"], 4, "{s}");
    x.call(json!({"op":"session_release","session":"s"}));
    let before = x.call(json!({"op":"stats"}));
    let long = "n".repeat(257);
    for (request, kind) in [
        (
            json!({"op":"match","tokens":[1,2],"ns":""}),
            "bad_namespace",
        ),
        (
            json!({"op":"match","tokens":[1,2],"ns":long}),
            "bad_namespace",
        ),
        (
            json!({"op":"insert","tokens":[1,2],"pages":[0],"ns":""}),
            "bad_namespace",
        ),
        (json!({"op":"match","tokens":[1,2],"ns":7}), "malformed"),
        (json!({"op":"evict","tokens":1,"ns":"a"}), "malformed"),
        (json!({"op":"stats","ns":"a"}), "malformed"),
    ] {
        assert_eq!(error_kind(&x.call(request.clone())), kind, "{request}");
        assert_eq!(x.call(json!({"op":"stats"})), before, "{request}");
    }
    let longest = "n".repeat(256);
    assert_eq!(m(x, json!(longest))["len"], 0);
}

both!(namespaces_over_exec, 2, 8, swa);

/// `evict_leaf`: the least recently used unlocked leaf goes whole (a leaf
/// of two pages at once), its handle answered and stale after; a locked
/// path is never taken; with nothing evictable, `null` and 0.
fn evict_leaf_takes_whole_leaves(x: &mut Exec) {
    let pages = x.call(json!({"op":"alloc","n":4}))["pages"].clone();
    let pages: Vec<u64> = serde_json::from_value(pages).expect("pages");
    // [1,2,3,4] (two pages) first, then [9,9] locked, then [7,7].
    x.call(json!({"op":"insert","tokens":[1,2,3,4],"pages":[pages[0],pages[1]]}));
    let locked = x.call(json!({"op":"insert","tokens":[9,9],"pages":[pages[2]],"lock":true}));
    x.call(json!({"op":"insert","tokens":[7,7],"pages":[pages[3]]}));
    let first = x.call(json!({"op":"evict_leaf"}));
    assert_eq!(first["evicted"], json!(4), "{first}");
    assert_eq!(
        x.call(json!({"op":"match","tokens":[1,2,3,4]}))["len"],
        json!(0)
    );
    let stale = x.call(json!({"op":"lock","handle":first["handle"]}));
    assert_eq!(error_kind(&stale), "stale_handle", "{stale}");
    assert_eq!(x.call(json!({"op":"evict_leaf"}))["evicted"], json!(2));
    assert_eq!(
        x.call(json!({"op":"evict_leaf"})),
        json!({"ok":true,"handle":null,"evicted":0})
    );
    x.call(json!({"op":"unlock","handle":locked["handle"]}));
    assert_eq!(
        x.call(json!({"op":"evict_leaf"})),
        json!({"ok":true,"handle":locked["handle"],"evicted":2})
    );
    let stats = x.call(json!({"op":"stats"}));
    assert_eq!(
        (&stats["free_pages"], &stats["nodes"]),
        (&json!(4), &json!(0)),
        "{stats}"
    );
}

#[test]
fn evict_leaf_in_process() {
    evict_leaf_takes_whole_leaves(&mut Exec::start(&["--page-size", "2", "--capacity", "4"]));
}

#[test]
fn evict_leaf_through_the_daemon() {
    let daemon = Daemon::start(&["--page-size", "2", "--capacity", "4"]);
    evict_leaf_takes_whole_leaves(&mut Exec::start(&["--connect", &daemon.name]));
}
