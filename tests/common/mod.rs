//! Helpers shared by the tests that drive the `radixd` binary.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde_json::Value;

/// Two engine client ids.
pub const A: u32 = 1;
pub const B: u32 = 2;

/// An in-process engine.
pub fn engine(page_size: u32, capacity: u32) -> radixd::engine::Engine {
    radixd::engine::Engine::new(radixd::engine::Config {
        page_size,
        capacity,
    })
    .expect("engine")
}

/// Asserts every invariant of `e`.
pub fn ok(e: &radixd::engine::Engine) {
    e.validate().expect("invariants hold");
}

/// The binary under test.
pub fn radixd() -> Command {
    Command::new(env!("CARGO_BIN_EXE_radixd"))
}

/// A running `radixd exec`, driven one line at a time.
pub struct Exec {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Exec {
    /// Starts `radixd exec ARGS`.
    pub fn start(args: &[&str]) -> Self {
        let mut child = radixd()
            .arg("exec")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn radixd exec");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Self {
            child,
            stdin,
            stdout,
        }
    }

    /// Sends one raw line and reads its answer.
    pub fn raw(&mut self, line: &[u8]) -> Value {
        self.stdin.write_all(line).expect("write");
        self.stdin.write_all(b"\n").expect("write");
        self.stdin.flush().expect("flush");
        let mut answer = String::new();
        self.stdout.read_line(&mut answer).expect("read");
        serde_json::from_str(&answer).unwrap_or_else(|e| panic!("bad answer {answer:?}: {e}"))
    }

    /// Sends one request and reads its answer.
    pub fn call(&mut self, request: Value) -> Value {
        self.raw(request.to_string().as_bytes())
    }

    /// Kills the process with `signal` and reaps it.
    pub fn kill(&mut self, signal: i32) {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe { libc::kill(self.child.id() as i32, signal) };
        let _ = self.child.wait();
    }
}

impl Drop for Exec {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `radixd serve` child on a segment name of its own, stopped (SIGTERM)
/// when dropped.
pub struct Daemon {
    pub name: String,
    child: Child,
}

impl Daemon {
    /// Starts a daemon with `args` after `--name` and waits until a client
    /// can connect.
    pub fn start(args: &[&str]) -> Self {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "radixd-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        Self::start_named(&name, args)
    }

    /// Starts a daemon on segment `name`.
    pub fn start_named(name: &str, args: &[&str]) -> Self {
        let child = radixd()
            .args(["serve", "--name", name])
            .args(args)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn radixd serve");
        let daemon = Self {
            name: name.to_owned(),
            child,
        };
        if let Err(e) = radixd::Client::connect_waiting(name, std::time::Duration::from_secs(10)) {
            panic!("daemon {name} did not come up: {e}");
        }
        daemon
    }

    /// The daemon's pid.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Kills the daemon with `signal` and reaps it.
    pub fn kill(&mut self, signal: i32) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe { libc::kill(self.pid(), signal) };
        self.child.wait().expect("wait for daemon")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill(libc::SIGTERM);
        }
    }
}
