//! `radixd bench` smoke runs with tiny sizes: both transports, `--compare`,
//! `--json`, a trace workload, and bad flags. No timing is asserted.

mod common;

use common::{assert_mentions, radixd, stdout_ok};
use serde_json::Value;

fn bench(args: &[&str]) -> std::process::Output {
    radixd()
        .arg("bench")
        .args(args)
        .output()
        .expect("run radixd bench")
}

/// The JSON lines of a successful `--json` run.
fn json_runs(out: std::process::Output) -> Vec<Value> {
    stdout_ok(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The JSON lines of a small successful run (60 requests of 64-token
/// prompts) with `args`.
fn small_json_runs(args: &[&str]) -> Vec<Value> {
    json_runs(bench(
        &[
            args,
            &["--json", "--requests", "60", "--prompt-tokens", "64"],
        ]
        .concat(),
    ))
}

#[test]
fn readers_peek_while_the_writers_run_and_report_their_success() {
    let runs = small_json_runs(&["--compare", "--readers", "2"]);
    assert_eq!(runs.len(), 2, "shm then uds");
    let readers = &runs[0]["readers"];
    assert_eq!(readers["readers"], 2, "{readers}");
    let peeks = readers["peeks"].as_u64().unwrap();
    assert!(peeks > 0, "{readers}");
    assert_eq!(readers["latency"]["count"], peeks);
    let success = readers["success"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&success), "{readers}");
    assert!(
        runs[1]["readers"].is_null(),
        "uds runs have no lock-free readers"
    );
}

#[test]
fn compare_json_reports_every_op_for_both_transports() {
    let runs = small_json_runs(&["--compare", "--clients", "1,2"]);
    assert_eq!(runs.len(), 4, "shm and uds for 1 and 2 clients");
    for (run, (transport, clients)) in
        runs.iter()
            .zip([("shm", 1), ("uds", 1), ("shm", 2), ("uds", 2)])
    {
        assert_eq!(run["transport"], transport);
        assert_eq!(run["clients"], clients);
        let ops = run["ops"].as_object().unwrap();
        // 60 steps per client: match, alloc and insert each time, an evict
        // on step 50.
        assert_eq!(ops["match"]["count"], 60 * clients);
        assert_eq!(ops["alloc"]["count"], 60 * clients);
        assert_eq!(ops["evict"]["count"], clients);
        let total: u64 = ops.values().map(|o| o["count"].as_u64().unwrap()).sum();
        assert_eq!(run["requests"].as_u64().unwrap(), total);
        assert_eq!(run["rejected"], 0);
        assert!(ops["match"]["p50_us"].as_f64().unwrap() > 0.0);
    }
    // Both transports served the same requests, so they hit the same.
    assert_eq!(runs[0]["hit_rate"], runs[1]["hit_rate"]);
}

#[test]
fn the_table_shows_ratios_and_a_trace_workload_runs() {
    let dir = std::env::temp_dir().join(format!("radixd-bench-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("t.jsonl");
    let line = |ids: &str| {
        format!(
            "{{\"timestamp\":0,\"input_length\":100,\"output_length\":1,\"hash_ids\":[{ids}]}}\n"
        )
    };
    std::fs::write(&trace, line("1,2") + &line("1,3") + &line("4")).unwrap();
    let out = bench(&[
        "--compare",
        "--requests",
        "20",
        "--trace",
        trace.to_str().unwrap(),
        "--block-size",
        "32",
        "--prompt-tokens",
        "64",
        "--page-size",
        "4",
        "--plot",
        dir.join("p.svg").to_str().unwrap(),
    ]);
    let text = stdout_ok(&out);
    assert_mentions(
        &text,
        &[
            "shm, 1 client(s)",
            "uds, 1 client(s)",
            "p99.9 µs",
            "uds/shm, match: p50",
            // --compare measures the baseline too.
            "baseline: one cache line between two processes",
            "p50/ping-pong",
        ],
    );
    let svg = std::fs::read_to_string(dir.join("p.svg")).unwrap();
    assert!(svg.contains("<svg") && svg.contains("shm p50") && svg.contains("uds p99"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--baseline`: the ping-pong and 4 KiB copy limits, measured in the same
/// run, printed once and as a ratio on every operation's row, and carried
/// in every JSON report. No timing is asserted.
#[test]
fn baseline_is_measured_and_every_round_trip_is_a_ratio_to_it() {
    let args = ["--baseline", "--requests", "20", "--prompt-tokens", "64"];
    let text = stdout_ok(&bench(&args));
    assert!(
        text.contains("baseline: one cache line between two processes p50")
            && text.contains("with a 4 KiB cross-core copy p50"),
        "{text}"
    );
    let header = text.lines().find(|l| l.contains("p99.9 µs")).unwrap();
    assert!(header.contains("p50/ping-pong") && header.contains("p50/4K copy"));
    let unlock = text
        .lines()
        .find(|l| l.trim_start().starts_with("unlock"))
        .unwrap();
    assert_eq!(unlock.matches('×').count(), 2, "{unlock}");

    let json = bench(&[&args[..], &["--json"]].concat());
    assert!(json.status.success());
    let run: Value = serde_json::from_str(String::from_utf8(json.stdout).unwrap().trim()).unwrap();
    let b = &run["baseline"];
    for key in [
        "pingpong_p50_us",
        "pingpong_p99_us",
        "copy4k_p50_us",
        "copy4k_p99_us",
    ] {
        assert!(b[key].as_f64().unwrap() > 0.0, "{key}: {b}");
    }
    // Without the flag, no baseline in the report.
    let plain = bench(&["--json", "--requests", "20", "--prompt-tokens", "64"]);
    let run: Value = serde_json::from_str(String::from_utf8(plain.stdout).unwrap().trim()).unwrap();
    assert!(run.get("baseline").is_none());
}

#[test]
fn bad_flags_exit_2() {
    for args in [
        &["--clients", "0"][..],
        &["--requests", "0"],
        &["--page-size", "0"],
        &["--transport", "tcp"],
        &["--connect", "x", "--transport", "uds"],
        &["--trace", "/no/such/trace.jsonl"],
        &["--tp", "0"],
        &["--tp", "2", "--transport", "uds"],
        &["--tp", "2", "--readers", "1"],
    ] {
        let out = bench(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(!out.stderr.is_empty());
    }
}

#[cfg(feature = "kv-events")]
#[test]
fn kv_events_compare_runs_off_then_on_with_a_subscriber() {
    let runs = small_json_runs(&["--kv-events-compare"]);
    assert_eq!(runs.len(), 2, "events off, then on");
    assert!(runs[0]["kv_events"].is_null());
    let ev = &runs[1]["kv_events"];
    assert!(ev["batches"].as_u64().unwrap() > 0, "{ev}");
    assert!(ev["events"].as_u64().unwrap() > 0, "{ev}");
    assert_eq!(ev["gaps"], 0);
    assert_eq!(ev["resyncs"], 0);
    // Same requests either way.
    assert_eq!(runs[0]["hit_rate"], runs[1]["hit_rate"]);
}

#[cfg(feature = "kv-events")]
#[test]
fn kv_events_latency_pairs_every_insert_with_its_event() {
    // Alone it turns events on; with --kv-events-compare it times the run
    // with events on.
    for args in [
        &["--kv-events-latency"][..],
        &["--kv-events-compare", "--kv-events-latency"],
    ] {
        let runs = small_json_runs(args);
        let on = runs.last().unwrap();
        let ev = &on["kv_events"];
        assert_eq!(ev["gaps"], 0, "{ev}");
        let lat = &ev["latency"];
        assert!(lat["matched"].as_u64().unwrap() > 0, "{lat}");
        // Every insert that cached pages was paired, and every event.
        assert_eq!(lat["unmatched_inserts"], 0, "{lat}");
        assert_eq!(lat["unmatched_events"], 0, "{lat}");
        for part in ["change_to_event", "change_to_batch", "batch_to_event"] {
            let (p50, p99, max) = (
                lat[part]["p50_us"].as_f64().unwrap(),
                lat[part]["p99_us"].as_f64().unwrap(),
                lat[part]["max_us"].as_f64().unwrap(),
            );
            assert!(p50 <= p99 && p99 <= max, "{part}: {lat}");
        }
    }
    // It needs a subscriber.
    let out = bench(&["--kv-events-latency", "--kv-events-no-subscriber"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

#[test]
fn locked_prompts_are_held_through_the_run() {
    // 1,000 of the 4,096 pages stay locked; the workload still runs whole
    // on both transports, and a hold larger than the pool is refused.
    let runs = small_json_runs(&["--compare", "--locked", "1000", "--capacity", "4096"]);
    assert_eq!(runs.len(), 2);
    for run in &runs {
        assert_eq!(run["rejected"], 0, "{run}");
        assert_eq!(run["ops"]["match"]["count"], 60);
    }
    assert_eq!(runs[0]["hit_rate"], runs[1]["hit_rate"]);
    let out = bench(&["--locked", "5000", "--capacity", "4096", "--requests", "5"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--locked"), "{err}");
}

#[test]
fn a_hybrid_daemon_runs_the_scheduler_step_with_its_component() {
    let runs = small_json_runs(&["--components", "full,swa", "--swa-window", "32"]);
    assert_eq!(runs[0]["rejected"], 0, "{}", runs[0]);
    assert!(runs[0]["ops"]["insert"]["count"].as_u64().unwrap() > 0);
    let runs = small_json_runs(&["--components", "full,mamba", "--mamba-capacity", "64"]);
    let ops = &runs[0]["ops"];
    assert_eq!(runs[0]["rejected"], 0, "{}", runs[0]);
    assert_eq!(ops["alloc_state"]["count"], ops["insert"]["count"], "{ops}");
    // The components configure a daemon this bench starts.
    let out = bench(&[
        "--compare",
        "--components",
        "full,swa",
        "--swa-window",
        "32",
    ]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

#[test]
fn tp_runs_one_client_alone_then_the_ranks_of_one_group() {
    let runs = small_json_runs(&["--tp", "3"]);
    assert_eq!(runs.len(), 2, "alone, then the group");
    assert_eq!(
        (runs[0]["clients"].as_u64(), runs[1]["clients"].as_u64()),
        (Some(1), Some(3))
    );
    // Every rank made the lone client's steps, with its answers: the same
    // hit rate, nothing rejected.
    for run in &runs {
        assert_eq!(run["rejected"], 0, "{run}");
        assert_eq!(
            run["ops"]["match"]["count"].as_u64().unwrap() % 60,
            0,
            "{run}"
        );
    }
    assert_eq!(runs[0]["hit_rate"], runs[1]["hit_rate"]);
    assert_eq!(runs[1]["ops"]["match"]["count"], 180);
    let out = bench(&["--tp", "2", "--requests", "40", "--prompt-tokens", "64"]);
    assert_mentions(
        &stdout_ok(&out),
        &[
            "2 ranks of one group",
            "p50 per rank / alone (2 ranks): match",
        ],
    );
}
