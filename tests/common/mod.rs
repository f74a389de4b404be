//! Helpers shared by the tests that drive the `radixd` binary.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde_json::Value;

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
}

impl Drop for Exec {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
