//! Reader epochs through a real daemon: freed nodes and evicted pages wait
//! for announced readers, a stalled reader is expired after
//! `--reader-expiry-ms`, and a dead reader's announcement is cleared when
//! its slot is reclaimed.

mod common;

use std::time::{Duration, Instant};

use common::{Daemon, Exec};
use radixd::op::{Reply, Request};
use radixd::shared::{read_info, Info, SharedLayout};
use radixd::Client;
use radixd_ipc::epoch::{EXPIRED, IDLE};
use radixd_ipc::sync::{AtomicU64, Ordering};
use radixd_ipc::{EpochClock, Offset, ReaderSlot, Segment, INFO_OFFSET};
use serde_json::json;

/// The test process's own read-write view of the daemon's reader table.
struct Table {
    segment: Segment,
    layout: SharedLayout,
}

impl Table {
    fn open(name: &str) -> Self {
        let segment = Segment::open_unverified(name).unwrap();
        let info: &Info = segment.get(Offset::new(INFO_OFFSET)).unwrap();
        let layout = SharedLayout::new(read_info(info).unwrap()).unwrap();
        Self { segment, layout }
    }

    /// The raw word of the epoch clock.
    fn clock(&self) -> &AtomicU64 {
        let (clock, _) = self.layout.readers(&self.segment).unwrap();
        // SAFETY: `EpochClock` is `#[repr(C, align(64))]` around one
        // `AtomicU64` at offset 0, so its address is that atomic's; this
        // test writes it as a stray write from a client would.
        unsafe { &*(clock as *const EpochClock).cast::<AtomicU64>() }
    }

    /// The raw word of reader slot `i`.
    fn word(&self, i: u32) -> &AtomicU64 {
        let (_, slots) = self.layout.readers(&self.segment).unwrap();
        let slot: &ReaderSlot = &slots[i as usize];
        // SAFETY: `ReaderSlot` is `#[repr(C, align(64))]` around one
        // `AtomicU64` at offset 0 (asserted in `radixd_ipc::epoch`), so its
        // address is that atomic's; this test writes it as a stalled or
        // dead reader would.
        unsafe { &*(slot as *const ReaderSlot).cast::<AtomicU64>() }
    }
}

#[test]
fn a_stalled_reader_holds_evicted_pages_until_it_is_expired() {
    let daemon = Daemon::start(&[
        "--page-size",
        "1",
        "--capacity",
        "8",
        "--reader-expiry-ms",
        "400",
    ]);
    let mut c = Client::connect(&daemon.name).unwrap();
    let tokens: Vec<u32> = (1..=8).collect();
    let pages = c.alloc(8).unwrap();
    c.insert(&tokens, &pages, false).unwrap();
    let table = Table::open(&daemon.name);
    // Another client's reader, stopped mid-walk at epoch 1 (before any of
    // what follows was unlinked).
    let stalled = (c.slot() + 1) % 16;
    table.word(stalled).store(1, Ordering::SeqCst);
    // Evict everything and ask for a page in the same round: every freed
    // page waits in limbo for the stalled reader, so the `alloc` waits for
    // it too (not failing as if the cache were locked full) while the
    // daemon serves everyone else...
    let name = daemon.name.clone();
    let waiting = std::thread::spawn(move || {
        let mut c = Client::connect(&name).unwrap();
        let t = Instant::now();
        let answers = c
            .batch(&[Request::Evict { tokens: 8 }, Request::Alloc { n: 1 }])
            .unwrap();
        (answers, t.elapsed(), c)
    });
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    let (stats, _) = c.stats().unwrap();
    assert!(
        t.elapsed() < Duration::from_millis(100),
        "others are served"
    );
    assert_eq!(
        (stats.total_tokens, stats.free_pages),
        (0, 0),
        "pages in limbo"
    );
    // ...until the daemon expires the reader and reuses the pages.
    let (answers, took, mut other) = waiting.join().unwrap();
    assert_eq!(answers[0], Ok(Reply::Evicted(8)));
    let page = match &answers[1] {
        Ok(Reply::Pages(page)) => page.clone(),
        other => panic!("alloc answered {other:?}"),
    };
    assert!(
        took >= Duration::from_millis(300),
        "answered after {took:?}"
    );
    assert_eq!(page.len(), 1);
    let word = table.word(stalled).load(Ordering::SeqCst);
    assert_ne!(
        word & EXPIRED,
        0,
        "the stalled reader was expired: {word:#x}"
    );
    other.free(&page).unwrap();
    let (stats, _) = c.stats().unwrap();
    assert_eq!(stats.free_pages, 8, "every page came back");
    c.validate().unwrap();
}

/// Any number of stalled readers cost one expiry: each one's clock starts
/// when the daemon first finds it in the way, so they are expired together
/// and the `alloc` that waits for the pages they hold is served, having
/// evicted its shortfall once.
#[test]
fn stalled_readers_are_expired_together() {
    for k in 1..=6u32 {
        let daemon = Daemon::start(&[
            "--page-size",
            "4",
            "--capacity",
            "64",
            "--max-clients",
            "8",
            "--reader-expiry-ms",
            "150",
        ]);
        let mut c = Client::connect(&daemon.name).unwrap();
        for prompt in 0..16u32 {
            let tokens: Vec<u32> = (0..16).map(|t| prompt * 100 + t).collect();
            let pages = c.alloc(4).unwrap();
            c.insert(&tokens, &pages, false).unwrap();
        }
        let table = Table::open(&daemon.name);
        // k other clients stopped in the middle of a `peek`: their slots
        // announce the current epoch.
        let epoch = table.clock().load(Ordering::SeqCst);
        let stalled: Vec<u32> = (0..8).filter(|&i| i != c.slot()).take(k as usize).collect();
        for &i in &stalled {
            table.word(i).store(epoch, Ordering::SeqCst);
        }
        let pages = c
            .alloc(4)
            .unwrap_or_else(|e| panic!("{k} stalled readers: {e}"));
        assert_eq!(pages.len(), 4);
        let (stats, _) = c.stats().unwrap();
        assert_eq!(stats.evicted_pages, 4, "{k} stalled readers: evicted once");
        for &i in &stalled {
            let word = table.word(i).load(Ordering::SeqCst);
            assert_ne!(word & EXPIRED, 0, "reader {i} of {k} expired: {word:#x}");
        }
        c.validate().unwrap();
    }
}

#[test]
fn a_dead_readers_announcement_is_cleared_with_its_slot() {
    let daemon = Daemon::start(&["--page-size", "1", "--capacity", "16"]);
    // The first client to connect takes slot 0.
    let mut reader = Exec::start(&["--connect", &daemon.name]);
    assert_eq!(reader.call(json!({"op":"stats"}))["ok"], true);
    let table = Table::open(&daemon.name);
    // It dies pinned.
    table.word(0).store(1, Ordering::SeqCst);
    reader.kill(libc::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(5);
    while table.word(0).load(Ordering::SeqCst) != IDLE {
        assert!(
            Instant::now() < deadline,
            "the dead reader's slot stays pinned"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // And it holds nothing back: evicted pages are reusable at once.
    let mut c = Client::connect(&daemon.name).unwrap();
    let pages = c.alloc(16).unwrap();
    let tokens: Vec<u32> = (1..=16).collect();
    c.insert(&tokens, &pages, false).unwrap();
    let again = c
        .batch(&[Request::Evict { tokens: 16 }, Request::Alloc { n: 16 }])
        .unwrap();
    assert!(
        matches!(&again[1], Ok(Reply::Pages(p)) if p.len() == 16),
        "{again:?}"
    );
}

#[test]
fn peek_stays_exact_beside_a_stalled_reader() {
    let daemon = Daemon::start(&["--page-size", "4", "--capacity", "64"]);
    let mut c = Client::connect(&daemon.name).unwrap();
    let tokens: Vec<u32> = (100..164).collect();
    let pages = c.alloc(16).unwrap();
    c.insert(&tokens, &pages, true).unwrap();
    let table = Table::open(&daemon.name);
    table.word((c.slot() + 1) % 16).store(1, Ordering::SeqCst);
    assert_eq!(c.peek(&tokens).unwrap(), (64, pages));
}

#[test]
fn a_stray_write_to_the_epoch_clock_holds_nothing_back() {
    let daemon = Daemon::start(&["--page-size", "1", "--capacity", "8"]);
    let mut c = Client::connect(&daemon.name).unwrap();
    let table = Table::open(&daemon.name);
    let tokens: Vec<u32> = (1..=8).collect();
    for garbage in [u64::MAX - 1, 0, 12345] {
        let pages = c.alloc(8).unwrap();
        c.insert(&tokens, &pages, false).unwrap();
        table.clock().store(garbage, Ordering::SeqCst);
        // With no reader announced, evicted pages are reusable at once,
        // whatever the shared clock says.
        let again = c
            .batch(&[Request::Evict { tokens: 8 }, Request::Alloc { n: 8 }])
            .unwrap();
        let Ok(Reply::Pages(p)) = &again[1] else {
            panic!("after a clock of {garbage}: {again:?}");
        };
        c.free(p).unwrap();
        assert_eq!(c.peek(&tokens).unwrap().0, 0);
    }
    c.validate().unwrap();
}
