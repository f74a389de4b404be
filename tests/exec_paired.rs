//! The hybrid step's paired and counted requests through `radixd exec`
//! (`alloc_paired`, `lock_paired`, `insert_paired`, `alloc_states`,
//! `free_states`, `"counted": true`), in-process and through a daemon:
//! each answers what the plain requests it stands for answer in a row, and
//! a refused one changes nothing.

mod common;

use common::{refused, Daemon, Exec};
use serde_json::json;

/// Runs `$scenario(&mut Exec)` in-process and through a daemon, both
/// started with `$args`.
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
        }
    };
}

with_args!(
    swa_paired_ops,
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
    mamba_state_batches,
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
    full_only_paired_ops,
    ["--page-size", "2", "--capacity", "8"]
);

/// `alloc_paired`, `insert_paired` and `lock_paired` answer the SWA
/// pairing `swa_pages` answers; `"counted"` adds the free counts `stats`
/// answers right after.
fn swa_paired_ops(x: &mut Exec) {
    let a = x.call(json!({"op":"alloc_paired","n":2}));
    assert_eq!(a["pages"], json!([0, 1]), "{a}");
    let pairing = x.call(json!({"op":"swa_pages","pages":[0,1]}))["swa_pages"].clone();
    assert_eq!(a["swa_pages"], pairing, "{a}");

    let i =
        x.call(json!({"op":"insert_paired","tokens":[1,2,3,4],"pages":[0,1],"lock":true,"tail":2}));
    assert_eq!(
        (&i["cached"], &i["len"], &i["pages"], &i["swa_pages"]),
        (&json!(0), &json!(4), &json!([0, 1]), &pairing),
        "{i}"
    );
    let inserted = i["handle"].as_u64().expect("the insert's lock");

    let m = x.call(json!({"op":"match","tokens":[1,2,3,4],"lock":true}));
    let node = m["handle"].as_u64().expect("a lock");
    let l = x.call(json!({"op":"lock_paired","handle":node,"pages":[0,1]}));
    assert_eq!((&l["delta"], &l["swa_pages"]), (&json!(0), &pairing), "{l}");
    let lock = l["handle"].as_u64().expect("the new lock's handle");

    // A page the pool has not: nothing locked, nothing else changed.
    refused(
        x,
        &[
            (
                json!({"op":"lock_paired","handle":node,"pages":[99]}),
                "page_out_of_range",
            ),
            (json!({"op":"reset","counted":true}), "malformed"),
            (json!({"op":"validate","counted":true}), "malformed"),
            (json!({"op":"alloc","n":1,"counted":1}), "malformed"),
            (json!({"op":"alloc_paired","n":1,"bogus":1}), "malformed"),
            (json!({"op":"alloc_states","n":1}), "component_off"),
        ],
    );

    let c = x.call(json!({"op":"alloc","n":1,"counted":true}));
    let stats = x.call(json!({"op":"stats"}));
    assert_eq!(c["pages"], json!([2]), "{c}");
    assert_eq!(
        (&c["free_pages"], &c["swa_free_pages"]),
        (&stats["free_pages"], &stats["swa_free_pages"]),
        "{c} against {stats}"
    );
    let c = x.call(json!({"op":"insert_paired","tokens":[1,2,3,4,5,6],"pages":[0,1,2],"tail":1,"counted":true}));
    assert_eq!((&c["cached"], &c["len"]), (&json!(4), &json!(6)), "{c}");
    assert_eq!(c["swa_pages"].as_array().map(Vec::len), Some(1), "{c}");
    assert_eq!(c["free_pages"], x.call(json!({"op":"stats"}))["free_pages"]);

    for h in [lock, node, inserted] {
        assert_eq!(
            x.call(json!({"op":"unlock","handle":h})),
            json!({"ok":true})
        );
    }
    assert_eq!(x.call(json!({"op":"validate"})), json!({"ok":true}));
}

/// `alloc_states` and `free_states`: all or none.
fn mamba_state_batches(x: &mut Exec) {
    assert_eq!(
        x.call(json!({"op":"alloc_states","n":2})),
        json!({"ok":true,"states":[0,1]})
    );
    refused(
        x,
        &[
            // More than there are: none handed out.
            (json!({"op":"alloc_states","n":9}), "insufficient_states"),
            // One of them never handed out: none given back.
            (
                json!({"op":"free_states","states":[0,2]}),
                "state_not_owned",
            ),
            (
                json!({"op":"free_states","states":[0,0]}),
                "state_not_owned",
            ),
            (
                json!({"op":"free_states","states":[4_294_967_296u64]}),
                "state_not_owned",
            ),
            (json!({"op":"free_states","states":"0"}), "malformed"),
        ],
    );
    assert_eq!(
        x.call(json!({"op":"free_states","states":[0,1]})),
        json!({"ok":true})
    );
    let c = x.call(json!({"op":"alloc_states","n":3,"counted":true}));
    assert_eq!(c["states"].as_array().map(Vec::len), Some(3), "{c}");
    assert_eq!(c["mamba_free_states"], json!(0), "{c}");
    assert_eq!(x.call(json!({"op":"validate"})), json!({"ok":true}));
}

/// Without SWA the pairing is empty and asking for one is
/// `component_off`; the counts carry FULL's pages only.
fn full_only_paired_ops(x: &mut Exec) {
    assert_eq!(
        x.call(json!({"op":"alloc_paired","n":1})),
        json!({"ok":true,"pages":[0],"swa_pages":[]})
    );
    refused(
        x,
        &[
            (
                json!({"op":"insert_paired","tokens":[1,2],"pages":[0],"tail":1}),
                "component_off",
            ),
            (json!({"op":"free_states","states":[0]}), "component_off"),
        ],
    );
    assert_eq!(
        x.call(json!({"op":"insert_paired","tokens":[1,2],"pages":[0],"counted":true})),
        json!({"ok":true,"cached":0,"len":2,"pages":[0],"free_pages":7})
    );
    assert_eq!(x.call(json!({"op":"validate"})), json!({"ok":true}));
}
