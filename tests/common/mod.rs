//! Helpers shared by the tests that drive the `radixd` binary.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

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

/// The stdout of a run that must have succeeded (its stderr in the panic
/// otherwise).
pub fn stdout_ok(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Asserts that `text` contains every one of `needles`.
pub fn assert_mentions(text: &str, needles: &[&str]) {
    for needle in needles {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
}

/// How long a test waits for what a daemon publishes on its own schedule:
/// `radixd stat`'s figures go out when the daemon catches up between
/// rounds, not with each answer, so they lag the requests a test just made
/// (on a loaded host, by as long as the daemon is not scheduled). Only a
/// broken daemon reaches this bound; a slow host only waits longer.
pub const PUBLISH_DEADLINE: Duration = Duration::from_secs(20);

/// Calls `probe` every few milliseconds until it answers `Ok`, and returns
/// that answer; past `deadline` it panics with the last `Err`, which says
/// what was seen instead of what was awaited.
pub fn wait_for<T>(deadline: Duration, mut probe: impl FnMut() -> Result<T, String>) -> T {
    let start = Instant::now();
    loop {
        match probe() {
            Ok(v) => return v,
            Err(seen) if start.elapsed() >= deadline => {
                panic!("not within {deadline:?}: {seen}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// What `radixd stat NAME` prints now (rates over 10 ms).
pub fn stat(name: &str) -> String {
    stdout_ok(
        &radixd()
            .args(["stat", name, "--interval", "0.01"])
            .output()
            .expect("run radixd stat"),
    )
}

/// What `radixd stat NAME` prints once it mentions every one of
/// `needles`: the figures a test expects after its requests, waited for
/// (see [`PUBLISH_DEADLINE`]) rather than read once.
pub fn stat_showing(name: &str, needles: &[&str]) -> String {
    wait_for(PUBLISH_DEADLINE, || {
        let text = stat(name);
        match needles.iter().find(|n| !text.contains(*n)) {
            None => Ok(text),
            Some(n) => Err(format!("{n:?} missing from:\n{text}")),
        }
    })
}

/// A running `radixd exec`, driven one line at a time.
pub struct Exec {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// Answers come from a cache with this secondary component on: their
    /// hybrid fields are checked, then removed (see [`Exec::hybrid`]).
    hybrid: Option<Hybrid>,
}

/// A secondary component an [`Exec`] checks and strips the fields of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hybrid {
    /// SWA without SWA pressure: every match's `full_kv_hit_length` is
    /// its `len`.
    Swa,
    /// MAMBA: every match names its `mamba_state`, every insert says
    /// `mamba_exist`.
    Mamba,
}

/// The fields a cache with secondary components adds to answers.
pub const HYBRID_FIELDS: [&str; 14] = [
    "full_kv_hit_length",
    "mamba_state",
    "mamba_exist",
    "swa_evicted",
    "mamba_evicted",
    "components",
    "swa_evictable_tokens",
    "swa_protected_tokens",
    "swa_free_pages",
    "evict_scanned_swa",
    "mamba_evictable_states",
    "mamba_protected_states",
    "mamba_free_states",
    "evict_scanned_mamba",
];

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
            hybrid: None,
        }
    }

    /// From now on answers are those of a cache with `component` on: each
    /// answer's hybrid fields are checked, then removed, so it reads as
    /// the full-only engine's answer.
    pub fn hybrid(mut self, component: Hybrid) -> Self {
        self.hybrid = Some(component);
        self
    }

    /// The secondary component this exec checks, if any.
    pub fn component(&self) -> Option<Hybrid> {
        self.hybrid
    }

    /// Sends one raw line and reads its answer.
    pub fn raw(&mut self, line: &[u8]) -> Value {
        self.stdin.write_all(line).expect("write");
        self.stdin.write_all(b"\n").expect("write");
        self.stdin.flush().expect("flush");
        let mut answer = String::new();
        self.stdout.read_line(&mut answer).expect("read");
        let mut value: Value =
            serde_json::from_str(&answer).unwrap_or_else(|e| panic!("bad answer {answer:?}: {e}"));
        let request: Value = serde_json::from_slice(line).unwrap_or(Value::Null);
        if let (Some(component), Value::Object(fields)) = (self.hybrid, &mut value) {
            check_hybrid(component, &request, fields);
            for name in HYBRID_FIELDS {
                fields.remove(name);
            }
            if request["op"] == "lock" {
                // With SWA, the handle naming the lock (checked above).
                fields.remove("handle");
            }
        }
        value
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

/// The checks of [`Exec::hybrid`] on one successful answer to `request`.
fn check_hybrid(component: Hybrid, request: &Value, answer: &serde_json::Map<String, Value>) {
    if answer.get("ok") != Some(&Value::Bool(true)) {
        return;
    }
    let op = request["op"].as_str().unwrap_or("");
    let has = |k: &str| answer.contains_key(k);
    match op {
        "match" => {
            let full = answer["full_kv_hit_length"].as_u64().expect("full length");
            let len = answer["len"].as_u64().expect("len");
            match component {
                Hybrid::Swa => assert_eq!(full, len, "no SWA pressure: {answer:?}"),
                Hybrid::Mamba => assert!(full >= len && has("mamba_state"), "{answer:?}"),
            }
        }
        "insert" => assert_eq!(has("mamba_exist"), component == Hybrid::Mamba, "{answer:?}"),
        "lock" => {
            // With SWA, `lock` answers the handle of the lock it took: the
            // lock bit and the node the request named.
            let asked = request["handle"].as_u64().expect("handle") & 0x7fff_ffff;
            match component {
                Hybrid::Swa => {
                    let h = answer["handle"].as_u64().expect("a lock's handle");
                    assert!(h & (1 << 31) != 0 && h & 0x7fff_ffff == asked, "{answer:?}");
                }
                Hybrid::Mamba => assert!(!has("handle"), "{answer:?}"),
            }
        }
        "evict" => assert!(has("swa_evicted") && has("mamba_evicted"), "{answer:?}"),
        "stats" => {
            let (name, field) = match component {
                Hybrid::Swa => ("full,swa", "swa_free_pages"),
                Hybrid::Mamba => ("full,mamba", "mamba_free_states"),
            };
            assert_eq!(answer["components"], name, "{answer:?}");
            assert!(answer[field].is_u64(), "{answer:?}");
        }
        _ => {}
    }
}

/// A `radixd serve` child on a segment name of its own, stopped (SIGTERM)
/// when dropped. When the last `Daemon` of a name goes, nothing of that
/// name may be left in /dev/shm (see [`Daemon::drop`]).
pub struct Daemon {
    pub name: String,
    child: Child,
    /// The files of the `ipc://` endpoints in its arguments (KV events),
    /// removed when it goes: their sockets' files outlive the daemon.
    ipc_files: Vec<std::path::PathBuf>,
}

/// The names of the `Daemon`s alive in this process, once per `Daemon`: a
/// test that kills a daemon and starts another on its segment holds two.
static LIVE: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Removes every file of segment `name` from /dev/shm (the segment, its
/// `.store`, a half-made `.NAME.*`) and returns their names.
fn remove_files_of(name: &str) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return Vec::new();
    };
    let (with_suffix, half_made) = (format!("{name}."), format!(".{name}."));
    let mut left = Vec::new();
    for entry in dir.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        if file == name || file.starts_with(&with_suffix) || file.starts_with(&half_made) {
            let _ = std::fs::remove_file(entry.path());
            left.push(file);
        }
    }
    left
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
            ipc_files: args
                .iter()
                .filter_map(|a| a.find("ipc://").map(|at| a[at + "ipc://".len()..].into()))
                .collect(),
        };
        LIVE.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(name.to_owned());
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
    /// Stops the daemon (it removes its segment on SIGTERM) and removes
    /// its `ipc://` endpoints' files. When this is the last `Daemon` of
    /// its name, whatever of the name is still in /dev/shm (a killed
    /// daemon's segment, a `--store` file the test did not remove) is
    /// removed, and a test that would have left it fails, naming it:
    /// tests leave nothing in /dev/shm.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill(libc::SIGTERM);
        }
        for file in &self.ipc_files {
            let _ = std::fs::remove_file(file);
        }
        let last = {
            let mut live = LIVE
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(at) = live.iter().position(|n| *n == self.name) {
                live.swap_remove(at);
            }
            !live.contains(&self.name)
        };
        if !last {
            return;
        }
        let left = remove_files_of(&self.name);
        if !left.is_empty() && !std::thread::panicking() {
            panic!(
                "the test left {left:?} in /dev/shm (removed now): remove what its daemons \
                 leave (a killed daemon's segment, a --store file) before it ends"
            );
        }
    }
}

/// The test process's own view of one client's slot, as a buggy or hostile
/// client would write it: its rings, scratch and slot word, used behind the
/// client's back while the client that holds the claim is idle.
pub struct Raw {
    pub segment: radixd_ipc::Segment,
    pub layout: radixd::shared::SharedLayout,
    pub slot: u32,
    /// The claim's generation: the high half of every `seq` the daemon
    /// accepts from this slot.
    pub generation: u32,
}

impl Raw {
    /// Maps the daemon's segment `name` and takes `client`'s slot.
    pub fn new(name: &str, client: &radixd::Client) -> Self {
        use radixd::shared::{read_info, Info, SharedLayout};
        use radixd_ipc::{Offset, Segment, INFO_OFFSET};
        let segment = Segment::open_unverified(name).unwrap();
        let info: &Info = segment.get(Offset::new(INFO_OFFSET)).unwrap();
        let layout = SharedLayout::new(read_info(info).unwrap()).unwrap();
        Self {
            segment,
            layout,
            slot: client.slot(),
            generation: client.generation(),
        }
    }

    /// The `seq` of this slot's claim numbered `n`.
    pub fn seq(&self, n: u64) -> u64 {
        (u64::from(self.generation) << 32) | n
    }

    /// The size of the segment's scratch area per client.
    pub fn scratch_len(&self) -> u64 {
        self.layout.config.scratch_bytes
    }

    fn client(
        &self,
    ) -> radixd_ipc::ClientRegions<radixd::wire::WireRequest, radixd::wire::WireReply> {
        self.layout.ipc.client(self.slot).unwrap()
    }

    /// Pushes `record` onto the slot's request ring and rings the daemon's
    /// doorbell; false when the ring is full.
    pub fn push(&self, record: radixd::wire::WireRequest) -> bool {
        let block = self
            .segment
            .client_block(&self.layout.ipc, self.slot)
            .unwrap();
        // SAFETY: the client that holds the claim is idle while the test
        // posts, and the test uses these views one call at a time, so this
        // is the ring's only producer for the call.
        let requests =
            unsafe { radixd_ipc::Producer::new(block.request_header, block.request_slots) }
                .unwrap();
        let pushed = requests.push(record).is_ok();
        self.ring_doorbell();
        pushed
    }

    /// Rings the daemon's doorbell.
    pub fn ring_doorbell(&self) {
        let doorbell: &radixd_ipc::Doorbell =
            self.segment.get(self.layout.ipc.daemon_doorbell).unwrap();
        doorbell.ring();
    }

    /// Posts `record` (after writing `payload` at `at` in the scratch area)
    /// and waits for the answer.
    pub fn exchange(
        &self,
        record: radixd::wire::WireRequest,
        at: u64,
        payload: &[u8],
    ) -> radixd::wire::WireReply {
        let c = self.client();
        let s = &self.segment;
        let scratch = s.scratch(c.scratch, c.scratch_len).unwrap();
        let _ = scratch.write_bytes(at, payload);
        assert!(self.push(record));
        let block = s.client_block(&self.layout.ipc, self.slot).unwrap();
        // SAFETY: as in `push`: the claim's client is idle, so this is the
        // reply ring's only consumer for the call.
        let replies =
            unsafe { radixd_ipc::Consumer::new(block.response_header, block.response_slots) }
                .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(reply) = replies.pop() {
                return reply;
            }
            assert!(Instant::now() < deadline, "no answer to {record:?}");
            std::thread::yield_now();
        }
    }

    /// Posts `request` (no payload) as record `n` of the client's claim,
    /// without waiting; false when the ring is full.
    pub fn post(&self, request: &radixd::op::Request, n: u32) -> bool {
        let e = radixd::wire::encode_request(request, 1, self.layout.config.capacity);
        assert_eq!(e.payload_len(), 0, "payload-free requests only");
        let half = self.layout.config.scratch_bytes / 2;
        self.push(radixd::wire::WireRequest {
            seq: self.seq(u64::from(n)),
            reply_off: half as u32,
            reply_len: e.reply_need as u32,
            ..e.record
        })
    }

    /// Overwrites the request ring's cursors (all three words) with
    /// garbage: the client then stamps its records where the daemon never
    /// looks.
    pub fn corrupt_request_ring(&self) {
        let c = self.client();
        let header = std::mem::size_of::<radixd_ipc::RingHeader>();
        let raw = self
            .segment
            .region(c.request_header.get(), header as u64)
            .unwrap();
        // SAFETY: the header lies inside the mapping (checked by `region`);
        // garbage there is the fault tested.
        unsafe { raw.as_ptr().write_bytes(0xee, header) };
    }

    /// Writes `(generation, state)` into the slot word through this
    /// process's own mapping (a stray write).
    pub fn poke_word(&self, generation: u32, state: u32) {
        let slots = self
            .segment
            .slots(self.layout.ipc.slots, self.layout.config.clients)
            .unwrap();
        slots.poke(self.slot, generation, state);
    }
}

/// A tiny deterministic generator (xorshift) for randomized tests that
/// must repeat exactly.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// The next number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The kind of an `exec` error answer (which must carry a message).
pub fn error_kind(answer: &Value) -> &str {
    assert_eq!(answer["ok"], false, "expected an error, got {answer}");
    assert!(answer["message"].as_str().is_some_and(|m| !m.is_empty()));
    answer["error"].as_str().expect("error kind")
}

/// Asserts each `(request, error kind)` fails so and changes nothing.
pub fn refused(x: &mut Exec, cases: &[(Value, &str)]) {
    let before = x.call(json!({"op":"stats"}));
    for (request, kind) in cases {
        assert_eq!(error_kind(&x.call(request.clone())), *kind, "{request}");
        assert_eq!(x.call(json!({"op":"stats"})), before, "{request} changed");
    }
}
