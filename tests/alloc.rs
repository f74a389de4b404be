//! No heap allocation per request, on either side: a counting global
//! allocator tallies what the client's thread and the daemon's thread
//! allocate while a warm client runs scheduler requests through a daemon
//! serving in this process.
//!
//! The client allocates only what an answer hands over to its caller (the
//! page list of a `match` or an `alloc`); the daemon allocates nothing.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use radixd::daemon::{serve, ServeConfig};
use radixd::Client;

/// Whose allocations a thread's are.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Other,
    Client,
    Daemon,
}

thread_local! {
    static SIDE: Cell<Side> = const { Cell::new(Side::Other) };
}

static MEASURING: AtomicBool = AtomicBool::new(false);
static CLIENT: AtomicU64 = AtomicU64::new(0);
static DAEMON: AtomicU64 = AtomicU64::new(0);

struct Counting;

// SAFETY: forwards every call to the system allocator unchanged; the
// bookkeeping touches only atomics and a const-initialised thread-local
// (no allocation, no re-entry).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

fn count() {
    // Relaxed: a flag and tallies read after the threads synchronise.
    if !MEASURING.load(Ordering::Relaxed) {
        return;
    }
    let side = SIDE.try_with(Cell::get).unwrap_or(Side::Other);
    match side {
        Side::Client => CLIENT.fetch_add(1, Ordering::Relaxed),
        Side::Daemon => DAEMON.fetch_add(1, Ordering::Relaxed),
        Side::Other => 0,
    };
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f` (as the client side) against a daemon serving in a thread of
/// this process.
fn with_daemon(f: impl FnOnce(&str)) {
    let name = format!("radixd-alloc-test-{}", std::process::id());
    let config = ServeConfig {
        name: name.clone(),
        page_size: 16,
        capacity: 4096,
        max_clients: 4,
        scratch_bytes: 1 << 20,
        ..ServeConfig::default()
    };
    let stop = AtomicU32::new(0);
    std::thread::scope(|s| {
        let daemon = s.spawn(|| {
            SIDE.with(|side| side.set(Side::Daemon));
            serve(&config, &stop)
        });
        let mut tries = 0;
        while Client::connect(&name).is_err() {
            tries += 1;
            assert!(tries < 5000, "the daemon did not start");
            std::thread::sleep(Duration::from_millis(1));
        }
        SIDE.with(|side| side.set(Side::Client));
        f(&name);
        SIDE.with(|side| side.set(Side::Other));
        stop.store(1, Ordering::Relaxed);
        daemon.join().expect("daemon thread").expect("daemon");
    });
}

/// Allocations `(client, daemon)` made while `f` ran.
fn allocations(f: impl FnOnce()) -> (u64, u64) {
    CLIENT.store(0, Ordering::Relaxed);
    DAEMON.store(0, Ordering::Relaxed);
    MEASURING.store(true, Ordering::SeqCst);
    f();
    MEASURING.store(false, Ordering::SeqCst);
    (
        CLIENT.load(Ordering::Relaxed),
        DAEMON.load(Ordering::Relaxed),
    )
}

#[test]
fn a_warm_client_and_daemon_allocate_nothing_per_request() {
    with_daemon(|name| {
        let mut c = Client::connect(name).unwrap();
        let prompt: Vec<u32> = (0..1024).collect();
        let pages = c.alloc(64).unwrap();
        assert!(c.anchoring());
        let h = c.insert(&prompt, &pages, true).unwrap().handle.unwrap();
        let step = |c: &mut Client| {
            let m = c.match_prefix(&prompt, true).unwrap();
            assert_eq!(m.len, 1024);
            let handle = m.handle.unwrap();
            c.lock(handle).unwrap();
            c.unlock(handle).unwrap();
            c.unlock(handle).unwrap();
            let fresh = c.alloc(1).unwrap();
            c.free(&fresh).unwrap();
            c.insert(&prompt, &pages, false).unwrap();
            c.evict(0).unwrap();
            c.stats().unwrap();
            c.peek(&prompt).unwrap();
        };
        // Warm: every buffer on both sides reaches its working size.
        for _ in 0..200 {
            step(&mut c);
        }
        if std::env::var_os("RADIXD_ALLOC_DEBUG").is_some() {
            let handle = c.match_prefix(&prompt, false).unwrap().handle.unwrap();
            eprintln!(
                "match {:?}",
                allocations(|| drop(c.match_prefix(&prompt, false)))
            );
            eprintln!(
                "lock {:?}",
                allocations(|| {
                    c.lock(handle).unwrap();
                })
            );
            eprintln!("unlock {:?}", allocations(|| c.unlock(handle).unwrap()));
            eprintln!("alloc {:?}", allocations(|| drop(c.alloc(1))));
            eprintln!(
                "insert {:?}",
                allocations(|| drop(c.insert(&prompt, &pages, false)))
            );
            eprintln!("evict {:?}", allocations(|| drop(c.evict(0))));
            eprintln!("stats {:?}", allocations(|| drop(c.stats())));
            eprintln!("peek {:?}", allocations(|| drop(c.peek(&prompt))));
        }
        const STEPS: u64 = 500;
        // Both ways of sending `match` and `insert`: by anchor (the
        // default), and with the whole key.
        for anchoring in [true, false] {
            c.set_anchoring(anchoring);
            step(&mut c);
            let (client, daemon) = allocations(|| {
                for _ in 0..STEPS {
                    step(&mut c);
                }
            });
            // Per step the caller owns three lists: the pages of `match`,
            // of `alloc`, and of `peek`; nothing else is allocated on its
            // side.
            assert!(
                client <= 3 * STEPS,
                "anchoring {anchoring}: the client allocated {client} times in {STEPS} steps"
            );
            // The daemon's rounds between requests (sweeps every 50 ms)
            // may allocate rarely; its requests never.
            assert!(
                daemon <= 4,
                "anchoring {anchoring}: the daemon allocated {daemon} times in {STEPS} steps of 9 requests"
            );
        }
        c.unlock(h).unwrap();
        c.validate().unwrap();
    });
}
