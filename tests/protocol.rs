//! The client protocol against a real daemon process: slot hand-over with a
//! request queued, a stray FREE over a live client's slot word, timeouts
//! that leave the client usable (SIGSTOP / SIGCONT), and a daemon that
//! sleeps beside a stuck or broken client.

mod common;

use std::time::{Duration, Instant};

use common::{Daemon, Raw};
use radixd::engine::Stats;
use radixd::op::{Reply, Request};
use radixd::shared::RING_CAPACITY;
use radixd::{Client, ClientError};
use radixd_ipc::slots::{CLAIMED, FREE};

fn connect(d: &Daemon) -> Client {
    Client::connect(&d.name).expect("connect")
}

/// `free + owned + cached == capacity`, with page size 1 (tokens = pages).
fn accounted(s: &Stats, capacity: u64) -> bool {
    s.free_pages + s.owned_pages + s.total_tokens == capacity
}

fn signal(d: &Daemon, sig: i32) {
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    assert_eq!(unsafe { libc::kill(d.pid(), sig) }, 0);
}

/// A client leaves with an `alloc` queued while the daemon is stopped; a
/// new client claims the same slot. The old request never runs for the new
/// client, the new one is served, and no page is left owned.
#[test]
fn a_queued_request_of_the_previous_holder_never_runs_for_the_next() {
    let daemon = Daemon::start(&["--page-size", "1", "--capacity", "16"]);
    let old = connect(&daemon);
    let slot = old.slot();
    let raw = Raw::new(&daemon.name, &old);
    signal(&daemon, libc::SIGSTOP);
    assert!(raw.post(&Request::Alloc { n: 4 }, 0));
    assert!(raw.post(&Request::Alloc { n: 4 }, 1));
    drop(old);
    // The new claim waits for the stopped daemon to adopt it.
    let name = daemon.name.clone();
    let newcomer = std::thread::spawn(move || Client::connect(&name));
    std::thread::sleep(Duration::from_millis(100));
    signal(&daemon, libc::SIGCONT);
    let mut new = newcomer.join().unwrap().expect("new client served");
    assert_eq!(new.slot(), slot, "the same slot changed hands");
    let (s, _) = new.stats().unwrap();
    assert_eq!((s.owned_pages, s.free_pages), (0, 16), "{s:?}");
    assert_eq!(new.alloc(2).unwrap().len(), 2);
    let (s, _) = new.stats().unwrap();
    assert_eq!(s.owned_pages, 2);
    new.validate().unwrap();
}

/// A client holding a lock on 3 pages and 2 more pages of its own (kept
/// by the caller).
fn victim_holding(daemon: &Daemon) -> (Client, Vec<u32>) {
    let mut victim = connect(daemon);
    let pages = victim.alloc(3).unwrap();
    let kept = victim.alloc(2).unwrap();
    victim.insert(&[1, 2, 3], &pages, true).unwrap();
    (victim, kept)
}

/// Waits (at most 1 s) until nothing is owned or locked any more.
fn until_released(other: &mut Client) {
    let left = Instant::now();
    loop {
        let (s, _) = other.stats().unwrap();
        if (s.owned_pages, s.protected_tokens) == (0, 0) {
            break;
        }
        assert!(left.elapsed() < Duration::from_secs(1), "{s:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A stray write of FREE over a live client's slot word releases nothing:
/// the daemon probes the client's liveness lock first. Once the client
/// really leaves, what it held comes back.
#[test]
fn a_stray_free_over_a_live_client_releases_nothing() {
    let daemon = Daemon::start(&["--page-size", "1", "--capacity", "16"]);
    let (victim, kept) = victim_holding(&daemon);
    let mut other = connect(&daemon);
    let (before, _) = other.stats().unwrap();
    assert_eq!((before.owned_pages, before.protected_tokens), (2, 3));

    let raw = Raw::new(&daemon.name, &victim);
    raw.poke_word(victim.generation() + 1, FREE);
    // Several sweeps and probes.
    std::thread::sleep(Duration::from_millis(300));
    let (after, _) = other.stats().unwrap();
    assert_eq!(
        (after.owned_pages, after.protected_tokens),
        (2, 3),
        "a live client's locks or pages were released: {after:?}"
    );
    // Its slot cannot be taken either: the lock is held.
    let third = connect(&daemon);
    assert_ne!(third.slot(), victim.slot());
    drop(third);

    // The client leaves for real: its lock goes, and so does what it held.
    drop(victim);
    until_released(&mut other);
    drop(kept);
    other.validate().unwrap();
}

/// A forged claim (CLAIMED written over a live client's slot word, with the
/// generation an honest next claim would have) releases nothing either: an
/// honest claim over a served slot comes only after its holder released it,
/// which the release records. Once the victim really leaves, what it held
/// comes back and the slot serves again.
#[test]
fn a_forged_claim_over_a_live_client_releases_nothing() {
    let daemon = Daemon::start(&["--page-size", "1", "--capacity", "16"]);
    let (victim, kept) = victim_holding(&daemon);
    let mut other = connect(&daemon);
    let raw = Raw::new(&daemon.name, &victim);
    for generation in [victim.generation() + 2, victim.generation() + 7] {
        raw.poke_word(generation, CLAIMED);
        std::thread::sleep(Duration::from_millis(150));
        let (after, _) = other.stats().unwrap();
        assert_eq!(
            (after.owned_pages, after.protected_tokens),
            (2, 3),
            "a forged claim released a live client: {after:?}"
        );
        // Nobody else can take the slot meanwhile.
        let third = connect(&daemon);
        assert_ne!(third.slot(), victim.slot());
    }
    drop(victim);
    until_released(&mut other);
    drop(kept);
    // The slot is reclaimed and serves a new client.
    let left = Instant::now();
    let mut clients = Vec::new();
    while clients.len() < 2 {
        clients.push(connect(&daemon));
        assert!(left.elapsed() < Duration::from_secs(2));
    }
    other.validate().unwrap();
}

/// The daemon stopped past the client's timeout: `Timeout`, then after
/// SIGCONT the next calls work, and the pages the late `alloc` answers
/// handed over went back to the pool (none leaked to a caller who never
/// saw them). The same for a batch whose answers partly arrived.
#[test]
fn a_timeout_leaves_the_client_usable_and_leaks_no_page() {
    const CAPACITY: u64 = 32;
    let daemon = Daemon::start(&["--page-size", "1", "--capacity", "32"]);
    let mut client = connect(&daemon);
    client.timeout = Duration::from_millis(100);
    let held = client.alloc(2).unwrap();
    let handle = client.insert(&[5, 6], &held, true).unwrap().handle.unwrap();

    signal(&daemon, libc::SIGSTOP);
    assert_eq!(client.alloc(3), Err(ClientError::Timeout));
    // Still out of step while the daemon sleeps: another timeout, and
    // nothing posted behind the late answer.
    assert_eq!(client.stats().map(drop), Err(ClientError::Timeout));
    signal(&daemon, libc::SIGCONT);
    client.timeout = Duration::from_secs(5);
    let (s, _) = client.stats().unwrap();
    assert!(accounted(&s, CAPACITY), "{s:?}");
    assert_eq!(s.owned_pages, 0, "a late alloc answer leaked pages: {s:?}");

    // A whole batch times out: pages and locks its late answers hand over
    // go back too.
    client.timeout = Duration::from_millis(100);
    signal(&daemon, libc::SIGSTOP);
    let batch = [
        Request::Alloc { n: 4 },
        Request::Match {
            tokens: vec![5, 6],
            lock: true,
        },
        Request::Lock {
            handle: handle.to_raw(),
        },
        Request::Stats,
    ];
    assert_eq!(client.batch(&batch), Err(ClientError::Timeout));
    signal(&daemon, libc::SIGCONT);
    client.timeout = Duration::from_secs(5);
    let (s, _) = client.stats().unwrap();
    assert!(accounted(&s, CAPACITY), "{s:?}");
    assert_eq!(s.owned_pages, 0, "late alloc answers leaked pages: {s:?}");
    assert_eq!(s.protected_tokens, 2, "only the caller's own lock: {s:?}");
    client.unlock(handle).unwrap();
    let (s, _) = client.stats().unwrap();
    assert_eq!(s.protected_tokens, 0, "a late lock stayed: {s:?}");
    let handle = client.lock(handle).unwrap();

    // A batch of which the daemon answers only some before the timeout:
    // stop it while the batch is in flight.
    client.timeout = Duration::from_millis(50);
    let pid = daemon.pid();
    let stopper = std::thread::spawn(move || {
        // SAFETY: kill(2) on the test's own child; no memory is involved.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
    });
    let many: Vec<_> = (0..200).map(|_| Request::Alloc { n: 0 }).collect();
    let mut with_pages = many.clone();
    with_pages.insert(0, Request::Alloc { n: 1 });
    let outcome = client.batch(&with_pages);
    stopper.join().unwrap();
    signal(&daemon, libc::SIGCONT);
    client.timeout = Duration::from_secs(5);
    let (s, _) = client.stats().unwrap();
    let expected_owned = match &outcome {
        Ok(answers) => match &answers[0] {
            Ok(Reply::Pages(p)) => p.len() as u64,
            other => panic!("{other:?}"),
        },
        Err(e) => {
            assert_eq!(*e, ClientError::Timeout);
            0
        }
    };
    assert_eq!(s.owned_pages, expected_owned, "{s:?}");
    assert!(accounted(&s, CAPACITY), "{s:?}");

    // And the client goes on as before.
    let pages = client.alloc(3).unwrap();
    client.free(&pages).unwrap();
    client.unlock(handle).unwrap();
    client.validate().unwrap();
}

/// CPU ticks (user + system) of process `pid`.
fn cpu_ticks(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) start at 3.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// A client that stops reading its answers (reply ring full) and one whose
/// ring words are garbage: the daemon sleeps as if idle.
#[test]
fn a_stuck_or_broken_client_leaves_the_daemon_idle() {
    let daemon = Daemon::start(&["--page-size", "1", "--capacity", "16"]);
    let stuck = connect(&daemon);
    let raw = Raw::new(&daemon.name, &stuck);
    // Fill the reply ring (the client never reads it) and leave requests
    // waiting behind it.
    let mut n = 0;
    let start = Instant::now();
    while n < 3 * RING_CAPACITY && start.elapsed() < Duration::from_secs(5) {
        if raw.post(&Request::Stats, n) {
            n += 1;
        } else {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    assert!(n >= 2 * RING_CAPACITY, "the daemon never read: {n}");
    let broken = connect(&daemon);
    Raw::new(&daemon.name, &broken).corrupt_request_ring();
    // Past the daemon's spin window, then measure.
    std::thread::sleep(Duration::from_millis(200));
    let (t0, ticks0) = (Instant::now(), cpu_ticks(daemon.pid()));
    std::thread::sleep(Duration::from_secs(2));
    let (ticks, secs) = (cpu_ticks(daemon.pid()) - ticks0, t0.elapsed().as_secs_f64());
    // 100 ticks per second; 10% of a core is 20 ticks in 2 s.
    assert!(
        (ticks as f64) < 0.10 * 100.0 * secs,
        "daemon used {ticks} ticks in {secs:.2} s beside a stuck client"
    );
    // Everyone else is still served.
    let mut fine = connect(&daemon);
    fine.stats().unwrap();
    drop((stuck, broken));
}

/// A record stamped with another claim's generation (a previous holder's)
/// is dropped unanswered: had it been answered, the client's next call
/// would meet an answer out of sequence.
#[test]
fn a_record_of_another_generation_is_dropped() {
    let daemon = Daemon::start(&["--page-size", "1", "--capacity", "16"]);
    let mut client = connect(&daemon);
    let mut raw = Raw::new(&daemon.name, &client);
    raw.generation = raw.generation.wrapping_sub(1);
    assert!(raw.post(&Request::Alloc { n: 2 }, 0));
    std::thread::sleep(Duration::from_millis(100));
    let (s, _) = client.stats().expect("no stray answer in the way");
    assert_eq!((s.owned_pages, s.free_pages), (0, 16), "{s:?}");
    assert_eq!(client.alloc(1).unwrap().len(), 1);
}
