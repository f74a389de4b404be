//! Safe on a shared host: `serve` never touches a file it did not create,
//! fails cleanly when /dev/shm is too small, refuses `reset` unless told,
//! shuts down cleanly on a corrupted engine region; and the CLI's answers
//! mean what they say (one session-id rule, daemon configuration over
//! flags, bad intervals refused, quiet on a closed pipe).

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{radixd, Daemon, Exec};
use serde_json::{json, Value};

fn unique(tag: &str) -> String {
    format!("radixd-host-{}-{tag}", std::process::id())
}

fn shm(name: &str) -> PathBuf {
    PathBuf::from("/dev/shm").join(name)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs `radixd ARGS` to completion, within a minute.
fn run(args: &[&str]) -> Output {
    let mut child = radixd()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn radixd");
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().expect("wait").is_none() {
        assert!(Instant::now() < deadline, "radixd {args:?} did not finish");
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().expect("output")
}

#[test]
fn serve_never_removes_a_file_it_did_not_create() {
    let name = unique("foreign");
    let path = shm(&name);
    let junk: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(&path, &junk).unwrap();
    let out = run(&["serve", "--name", &name]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("not a radixd segment"), "{err}");
    assert!(
        err.contains(path.to_str().unwrap()),
        "names the file: {err}"
    );
    assert!(!err.contains("serving"), "no false start line: {err}");
    assert_eq!(std::fs::read(&path).unwrap(), junk, "the file is untouched");
    // A client says what the file is, too.
    let out = run(&["stat", &name]);
    assert!(
        stderr(&out).contains("not a radixd segment"),
        "{}",
        stderr(&out)
    );
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn serve_fails_cleanly_when_shm_is_too_small() {
    // 2^30 pages is the largest capacity; its segment is far larger than
    // this machine's /dev/shm.
    let name = unique("nospace");
    let out = run(&["serve", "--name", &name, "--capacity", "1073741824"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("needs") && err.contains("free"),
        "names the size needed and the space free: {err}"
    );
    assert!(!err.contains("outside 1..=2^30"), "{err}");
    assert!(!err.contains("serving"), "{err}");
    assert!(!shm(&name).exists(), "nothing left behind");
    let leftovers = std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().contains(&name))
        .count();
    assert_eq!(leftovers, 0, "no temporary file left behind");
}

#[test]
fn serve_announces_itself_with_the_segment_size_once_ready() {
    let name = unique("announce");
    let mut child = radixd()
        .args(["serve", "--name", &name, "--capacity", "1024"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    // The line comes after the segment exists.
    assert!(shm(&name).exists(), "{line}");
    assert!(
        line.contains(&format!("serving /dev/shm/{name} (")) && line.contains("MiB"),
        "{line}"
    );
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    child.wait().unwrap();
    assert!(!shm(&name).exists(), "removed on SIGTERM");
}

#[test]
fn bad_configuration_gets_no_serving_line() {
    let out = run(&["serve", "--name", &unique("badcfg"), "--page-size", "0"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("page size") && !err.contains("serving"),
        "{err}"
    );
}

#[test]
fn reset_through_a_daemon_needs_allow_reset() {
    let daemon = Daemon::start(&["--page-size", "2", "--capacity", "8"]);
    let mut x = Exec::start(&["--connect", &daemon.name]);
    assert_eq!(x.call(json!({"op":"alloc","n":2}))["ok"], true);
    let before = x.call(json!({"op":"stats"}));
    let refused = x.call(json!({"op":"reset"}));
    assert_eq!(refused["error"], "not_permitted", "{refused}");
    assert!(refused["message"]
        .as_str()
        .unwrap()
        .contains("--allow-reset"));
    assert_eq!(x.call(json!({"op":"stats"})), before, "nothing changed");

    let daemon = Daemon::start(&["--page-size", "2", "--capacity", "8", "--allow-reset"]);
    let mut x = Exec::start(&["--name", &daemon.name]);
    assert_eq!(x.call(json!({"op":"alloc","n":2}))["ok"], true);
    assert_eq!(x.call(json!({"op":"reset"})), json!({"ok":true}));
    assert_eq!(x.call(json!({"op":"stats"}))["free_pages"], 8);
}

#[test]
fn capacity_limit_and_its_message_agree() {
    use radixd::engine::{layout::MAX_CAPACITY, ConfigError, EngineLayout};
    assert_eq!(MAX_CAPACITY, 1 << 30);
    for page_size in [1, 16, 1024] {
        assert!(
            EngineLayout::new(page_size, MAX_CAPACITY).is_ok(),
            "2^30 pages of {page_size} tokens is inside the documented range"
        );
    }
    let err = EngineLayout::new(16, MAX_CAPACITY + 1).unwrap_err();
    assert_eq!(err, ConfigError::Capacity(MAX_CAPACITY + 1));
    assert!(err.to_string().contains("outside 1..=2^30"));
}

#[test]
fn exec_and_bench_take_the_daemons_configuration() {
    let daemon = Daemon::start(&["--page-size", "4", "--capacity", "256"]);
    // A contradicting flag is refused, an agreeing one accepted.
    let out = run(&["exec", "--connect", &daemon.name, "--page-size", "2"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("disagrees"), "{}", stderr(&out));
    let mut x = Exec::start(&["--connect", &daemon.name, "--page-size", "4"]);
    assert_eq!(x.call(json!({"op":"alloc","n":1}))["ok"], true);
    drop(x);

    let out = run(&["bench", "--connect", &daemon.name, "--page-size", "16"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("disagrees"), "{}", stderr(&out));
    // Without flags the workload follows the daemon's page size: prompts
    // share a system prompt, so the hit rate cannot be zero.
    let out = run(&[
        "bench",
        "--name",
        &daemon.name,
        "--json",
        "--requests",
        "50",
        "--prompt-tokens",
        "64",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report["hit_rate"].as_f64().unwrap() > 0.0, "{report}");
    assert_eq!(report["rejected"], 0, "{report}");
}

#[test]
fn stat_takes_the_name_either_way_and_refuses_bad_intervals() {
    let daemon = Daemon::start(&["--page-size", "2", "--capacity", "8"]);
    for args in [
        vec!["stat", daemon.name.as_str(), "--interval", "0.01"],
        vec!["stat", "--name", daemon.name.as_str(), "--interval", "0.01"],
    ] {
        let out = run(&args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        assert!(String::from_utf8_lossy(&out.stdout).contains("page size 2"));
    }
    for bad in ["nan", "0", "-1", "1e10", "inf", "soon"] {
        let out = run(&["stat", &daemon.name, &format!("--interval={bad}")]);
        assert_eq!(out.status.code(), Some(2), "--interval {bad}");
        assert!(stderr(&out).contains("interval"), "{bad}: {}", stderr(&out));
    }
}

#[test]
fn printing_into_a_closed_pipe_is_quiet() {
    let daemon = Daemon::start(&["--page-size", "2", "--capacity", "8"]);
    let mut child = radixd()
        .args(["stat", &daemon.name, "--interval", "0.05"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // the reader goes away, as `| head -0` would
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let status = child.wait().unwrap();
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.is_empty(), "nothing on stderr: {err}");
    use std::os::unix::process::ExitStatusExt;
    assert!(
        status.success() || status.signal() == Some(libc::SIGPIPE),
        "{status:?}"
    );
}

#[test]
fn a_corrupted_engine_region_stops_the_daemon_cleanly() {
    use radixd::shared::{SegmentConfig, SharedLayout};
    let name = unique("corrupt");
    let mut child = radixd()
        .args(["serve", "--name", &name, "--page-size", "2"])
        .args(["--capacity", "64", "--max-clients", "4"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    err.read_line(&mut line).unwrap();
    assert!(line.contains("serving"), "{line}");
    let layout = SharedLayout::new(SegmentConfig {
        page_size: 2,
        capacity: 64,
        clients: 4,
        scratch_bytes: 16 << 20,
    })
    .unwrap();
    // A hostile process of the same user overwrites the engine (header,
    // nodes, pages, free ring, child table) with garbage.
    {
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(shm(&name))
            .unwrap();
        let at = layout.engine_at + 64; // past the sequence word
        let garbage = vec![0x01u8; layout.engine.size() - 64];
        file.write_all_at(&garbage, at).unwrap();
    }
    let mut x = Exec::start(&["--connect", &name]);
    let a = x.call(json!({"op":"alloc","n":1}));
    let b = x.call(json!({"op":"insert","tokens":[1,2],"pages":[0]}));
    assert!(
        a["ok"] == false || b["ok"] == false,
        "the damage is met: {a} {b}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the daemon did not stop");
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    assert_eq!(status.code(), Some(2), "{rest}");
    assert!(rest.contains("engine region corrupted"), "{rest}");
    assert!(!shm(&name).exists(), "the segment was removed");
    // The client learns the daemon is gone.
    let gone = x.call(json!({"op":"stats"}));
    assert_eq!(gone["error"], "daemon_gone", "{gone}");
}

#[test]
fn cli_spellings_of_the_daemon_name_agree() {
    // `--name` works everywhere; the older spellings keep working.
    let out = Command::new(env!("CARGO_BIN_EXE_radixd"))
        .args(["exec", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("--connect") && help.contains("--name"),
        "{help}"
    );
}
