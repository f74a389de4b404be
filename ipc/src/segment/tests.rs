//! Segments over real /dev/shm files: creation, takeover, refusal of foreign
//! files, rings and scratch over a mapping, liveness across processes.

use super::*;
use crate::layout::{LayoutConfig, SegmentLayout};
use crate::ring::{Consumer, Producer, RingHeader};
use crate::shm::Offset;
use crate::slots::SlotLocks;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

const HASH: u64 = 0x1234_5678;

fn name(tag: &str) -> String {
    format!("radixd-ipc-test-{}-{tag}", std::process::id())
}

type Msg = [u64; 2];

fn layout() -> SegmentLayout<Msg, Msg> {
    SegmentLayout::new(LayoutConfig {
        clients: 3,
        request_capacity: 8,
        response_capacity: 8,
        scratch_bytes: 4 << 20,
        user_bytes: 4096,
        user_version: 7,
    })
    .unwrap()
}

#[test]
fn create_open_and_unlink_on_drop() {
    let n = name("basic");
    let seg = Segment::create(&n, 8192, 0o600, HASH).unwrap();
    assert!(seg.is_owner());
    let mode = std::fs::metadata(seg.path()).unwrap().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let client = Segment::open(&n, HASH).unwrap();
    assert_eq!(client.info(), seg.info());
    assert_eq!(client.info().daemon_pid, u64::from(std::process::id()));
    assert_eq!(client.len(), 8192);
    assert!(client.is_daemon_alive().unwrap());
    assert_eq!(
        Segment::open(&n, HASH + 1).err(),
        Some(OpenError::LayoutMismatch {
            expected: HASH + 1,
            found: HASH
        })
    );
    assert_eq!(
        Segment::create(&n, 8192, 0o600, HASH).err(),
        Some(CreateError::AlreadyRunning)
    );
    let path = seg.path().to_owned();
    drop(seg);
    assert!(!path.exists());
    // The client's mapping stays valid; the daemon is gone.
    assert!(!client.is_daemon_alive().unwrap());
    assert_eq!(Segment::open(&n, HASH).err(), Some(OpenError::NotFound));
}

#[test]
fn mode_can_be_widened() {
    let n = name("mode");
    let seg = Segment::create(&n, 4096, 0o660, HASH).unwrap();
    assert_eq!(std::fs::metadata(seg.path()).unwrap().mode() & 0o777, 0o660);
}

#[test]
fn bad_names_and_sizes() {
    assert_eq!(
        Segment::create("a/b", 4096, 0o600, 0).err(),
        Some(CreateError::InvalidName)
    );
    assert_eq!(
        Segment::create("", 4096, 0o600, 0).err(),
        Some(CreateError::InvalidName)
    );
    assert_eq!(
        Segment::create(&name("small"), 10, 0o600, 0).err(),
        Some(CreateError::InvalidSize(10))
    );
    assert_eq!(Segment::open("..", 0).err(), Some(OpenError::InvalidName));
}

#[test]
fn garbage_files_are_refused() {
    let n = name("garbage");
    let path = Path::new(SHM_DIR).join(&n);
    std::fs::write(&path, [0u8; 10]).unwrap();
    assert_eq!(
        Segment::open(&n, HASH).err(),
        Some(OpenError::TooSmall {
            file: 10,
            needed: 64
        })
    );
    // Magic is checked before anything else: a foreign file is never
    // reported as a segment that is merely not ready.
    std::fs::write(&path, [0u8; 4096]).unwrap();
    assert_eq!(Segment::open(&n, HASH).err(), Some(OpenError::BadMagic(0)));
    let mut bytes = vec![0xabu8; 4096];
    bytes[48..52].copy_from_slice(&1u32.to_le_bytes()); // ready
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(
        Segment::open(&n, HASH).err(),
        Some(OpenError::BadMagic(0xabab_abab_abab_abab))
    );
    bytes[0..8].copy_from_slice(&MAGIC.to_le_bytes());
    bytes[48..52].copy_from_slice(&0u32.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(Segment::open(&n, HASH).err(), Some(OpenError::NotReady));
    bytes[48..52].copy_from_slice(&1u32.to_le_bytes());
    bytes[8..12].copy_from_slice(&99u32.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(
        Segment::open(&n, HASH).err(),
        Some(OpenError::VersionMismatch {
            expected: HEADER_VERSION,
            found: 99
        })
    );
    bytes[8..12].copy_from_slice(&HEADER_VERSION.to_le_bytes());
    bytes[16..24].copy_from_slice(&HASH.to_le_bytes());
    bytes[24..32].copy_from_slice(&8192u64.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(
        Segment::open(&n, HASH).err(),
        Some(OpenError::TooSmall {
            file: 4096,
            needed: 8192
        })
    );
    bytes[24..32].copy_from_slice(&4096u64.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    // Well-formed but nobody holds the daemon lock.
    assert_eq!(Segment::open(&n, HASH).err(), Some(OpenError::DaemonDead));
    // ...so a new daemon takes it over.
    let seg = Segment::create(&n, 4096, 0o600, HASH + 5).unwrap();
    assert_eq!(
        Segment::open(&n, HASH + 5).unwrap().info().layout_hash,
        HASH + 5
    );
    drop(seg);
    assert!(!path.exists());
}

#[test]
fn foreign_files_are_never_removed() {
    let n = name("foreign");
    let path = Path::new(SHM_DIR).join(&n);
    // Another program's file, larger than a header, without our magic.
    let junk: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + 3) as u8).collect();
    std::fs::write(&path, &junk).unwrap();
    assert_eq!(
        Segment::create(&n, 4096, 0o600, HASH).err(),
        Some(CreateError::NotASegment)
    );
    assert_eq!(std::fs::read(&path).unwrap(), junk);
    // Shorter than a magic number.
    std::fs::write(&path, b"abc").unwrap();
    assert_eq!(
        Segment::create(&n, 4096, 0o600, HASH).err(),
        Some(CreateError::NotASegment)
    );
    assert_eq!(std::fs::read(&path).unwrap(), b"abc");
    std::fs::remove_file(&path).unwrap();
    // A directory, a symbolic link (even to a stale segment) and a FIFO.
    std::fs::create_dir(&path).unwrap();
    assert_eq!(
        Segment::create(&n, 4096, 0o600, HASH).err(),
        Some(CreateError::NotASegment)
    );
    assert!(path.is_dir());
    std::fs::remove_dir(&path).unwrap();
    let target = Path::new(SHM_DIR).join(name("foreign-target"));
    std::fs::write(&target, &junk).unwrap();
    std::os::unix::fs::symlink(&target, &path).unwrap();
    assert_eq!(
        Segment::create(&n, 4096, 0o600, HASH).err(),
        Some(CreateError::NotASegment)
    );
    assert_eq!(std::fs::read(&target).unwrap(), junk);
    std::fs::remove_file(&path).unwrap();
    std::fs::remove_file(&target).unwrap();
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    assert_eq!(
        Segment::create(&n, 4096, 0o600, HASH).err(),
        Some(CreateError::NotASegment)
    );
    assert_eq!(Segment::open(&n, HASH).err(), Some(OpenError::BadMagic(0)));
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn too_little_room_is_a_clean_error() {
    let n = name("nospace");
    let free = free_bytes(Path::new(SHM_DIR)).unwrap();
    let size = (free + (1 << 30)).next_multiple_of(4096);
    match Segment::create(&n, size, 0o600, HASH) {
        Err(CreateError::NoSpace { needed, free: f }) => {
            assert_eq!(needed, size);
            assert!(f < size, "free {f} of needed {size}");
        }
        other => panic!("expected NoSpace, got {other:?}"),
    }
    // Nothing left behind: neither the name nor the temporary file.
    assert!(!Path::new(SHM_DIR).join(&n).exists());
    let leftovers = std::fs::read_dir(SHM_DIR)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(&n))
        .count();
    assert_eq!(leftovers, 0);
    let message = CreateError::NoSpace {
        needed: 3 << 30,
        free: 64 << 20,
    }
    .to_string();
    assert!(
        message.contains("3.0 GiB") && message.contains("64.0 MiB"),
        "{message}"
    );
}

#[test]
fn stale_segment_is_taken_over() {
    let n = name("stale");
    let seg = Segment::create(&n, 4096, 0o600, HASH).unwrap();
    // A copy is an identical segment whose daemon lock nobody holds.
    let stale = name("stale2");
    std::fs::copy(seg.path(), Path::new(SHM_DIR).join(&stale)).unwrap();
    let old = Segment::create(&stale, 4096, 0o600, HASH).unwrap();
    assert_ne!(old.info().incarnation, seg.info().incarnation);
    assert!(Segment::open(&stale, HASH)
        .unwrap()
        .is_daemon_alive()
        .unwrap());
}

#[test]
fn regions_are_checked() {
    let n = name("regions");
    let seg = Segment::create(&n, 8192, 0o600, HASH).unwrap();
    assert!(seg.region(8000, 192).is_ok());
    assert!(matches!(
        seg.region(8000, 193),
        Err(RegionError::OutOfBounds { .. })
    ));
    assert!(matches!(
        seg.region(u64::MAX, 2),
        Err(RegionError::OutOfBounds { .. })
    ));
    assert_eq!(
        seg.get(Offset::<RingHeader>::new(64)).err(),
        Some(RegionError::Misaligned {
            offset: 64,
            align: 128
        })
    );
    assert!(seg.slice(Offset::<ClientSlot>::new(64), u64::MAX).is_err());
    assert!(seg.slice(Offset::<ClientSlot>::new(64), 3).is_ok());
}

#[test]
fn rings_and_scratch_over_a_real_segment() {
    let l = layout();
    let n = name("rings");
    let daemon = Segment::create(&n, l.total_size, 0o600, l.hash).unwrap();
    let client = Segment::open(&n, l.hash).unwrap();
    let c = l.client(1).unwrap();
    const N: u64 = 50_000;
    let tokens: Vec<u32> = (0..1 << 20).collect(); // 1M tokens = 4 MiB
    std::thread::scope(|s| {
        s.spawn(|| {
            let h = client.get(c.request_header).unwrap();
            let slots = client.slice(c.request_slots, 8).unwrap();
            // SAFETY: this thread is the only producer of the ring.
            let p = unsafe { Producer::new(h, slots) }.unwrap();
            let scratch = client.scratch(c.scratch, c.scratch_len).unwrap();
            scratch.write_u32s(0, &tokens).unwrap();
            for i in 0..N {
                let mut m = [i, !i];
                while let Err(back) = p.push(m) {
                    m = back;
                    std::thread::yield_now();
                }
            }
        });
        let h = daemon.get(c.request_header).unwrap();
        let slots = daemon.slice(c.request_slots, 8).unwrap();
        // SAFETY: this thread is the only consumer of the ring.
        let q = unsafe { Consumer::new(h, slots) }.unwrap();
        let mut next = 0;
        while next < N {
            match q.pop() {
                Some(m) => {
                    assert_eq!(m, [next, !next]);
                    next += 1;
                }
                None => std::thread::yield_now(),
            }
        }
    });
    let mut out = Vec::new();
    let scratch = daemon.scratch(c.scratch, c.scratch_len).unwrap();
    scratch.read_u32s(0, 1 << 20, &mut out).unwrap();
    assert_eq!(out, tokens);
    assert!(scratch.read_u32s(4, 1 << 20, &mut out).is_err());
}

#[test]
fn garbage_in_a_ring_in_shared_memory_is_never_a_message() {
    let l = layout();
    let n = name("corrupt");
    let seg = Segment::create(&n, l.total_size, 0o600, l.hash).unwrap();
    let c = l.client(0).unwrap();
    // A hostile peer scribbles over the ring's cursors and entries.
    let (header, entries) = (c.request_header.get(), c.request_slots.get());
    for (at, len) in [(header, 256), (entries, 8 * 64)] {
        // SAFETY: in bounds (checked by `region`); plain bytes.
        unsafe {
            seg.region(at, len)
                .unwrap()
                .as_ptr()
                .write_bytes(0xee, len as usize)
        };
    }
    let h = seg.get(c.request_header).unwrap();
    let slots = seg.slice(c.request_slots, 8).unwrap();
    // SAFETY: single consumer in this test.
    let q = unsafe { Consumer::<Msg>::new(h, slots) }.unwrap();
    // Every stamp is 0xeeee..ee, the cursor expects 0xeeee..ef: no message.
    assert_eq!(q.pop(), None);
    assert!(!q.has_work());
    // A stamp that happens to match delivers its garbage as plain data.
    let entry = entries + (0xeeee_eeee_eeee_eeee_u64 & 7) * 64;
    // SAFETY: in bounds; the stamp is the entry's first u64.
    unsafe {
        seg.region(entry, 8)
            .unwrap()
            .cast::<u64>()
            .as_ptr()
            .write(0xeeee_eeee_eeee_eeef)
    };
    assert_eq!(q.pop(), Some([0xeeee_eeee_eeee_eeee; 2]));
    // A consumer `tail` ahead of everything pushed: the producer sees a
    // full (corrupt) ring and overwrites nothing.
    let h = seg.get(c.response_header).unwrap();
    let slots = seg.slice(c.response_slots, 8).unwrap();
    // SAFETY: in bounds; `tail` is the header's second cache-padded word.
    unsafe {
        seg.region(c.response_header.get() + 128, 8)
            .unwrap()
            .cast::<u64>()
            .as_ptr()
            .write(1 << 40)
    };
    // SAFETY: single producer in this test.
    let p = unsafe { Producer::<Msg>::new(h, slots) }.unwrap();
    for i in 0..8 {
        assert!(p.push([i, i]).is_ok() || p.is_corrupt());
    }
    assert!(p.push([9, 9]).is_err());
    assert!(p.is_corrupt());
}

const CHILD_ENV: &str = "RADIXD_IPC_TEST_CHILD_SEGMENT";

/// Re-executed as a child by `dead_client_is_detected`: claims a slot,
/// reports it, then waits to be killed. A no-op in a normal test run.
#[test]
fn child_claims_slot_helper() {
    let Ok(n) = std::env::var(CHILD_ENV) else {
        return;
    };
    let l = layout();
    let seg = Segment::open(&n, l.hash).unwrap();
    let claim = seg.claim_slot(l.slots, 3).unwrap();
    println!("CLAIMED {} {}", claim.index, claim.generation);
    std::thread::sleep(std::time::Duration::from_secs(60));
}

#[test]
fn dead_client_is_detected() {
    let l = layout();
    let n = name("liveness");
    let daemon = Segment::create(&n, l.total_size, 0o600, l.hash).unwrap();
    // A same-process client in slot 0, to check probes don't mix slots.
    let local = Segment::open(&n, l.hash).unwrap();
    let mine = local.claim_slot(l.slots, 3).unwrap();
    assert_eq!(
        local.claim_slot(l.slots, 3),
        Err(ClaimError::AlreadyClaimed)
    );

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "segment::tests::child_claims_slot_helper",
            "--exact",
            "--nocapture",
        ])
        .env(CHILD_ENV, &n)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = lines
        .find_map(|l| l.ok().filter(|l| l.starts_with("CLAIMED ")))
        .expect("child claimed a slot");
    let idx: u32 = line.split(' ').nth(1).unwrap().parse().unwrap();
    assert_ne!(idx, mine.index);

    let table = daemon.slots(l.slots, 3).unwrap();
    let st = table.status(idx).unwrap();
    assert!(st.alive && st.state == crate::slots::CLAIMED);
    assert_eq!(st.pid, u64::from(child.id()));
    assert!(daemon.is_client_alive(idx).unwrap());
    assert_eq!(table.reclaim(st), Err(SlotError::Alive));

    child.kill().unwrap(); // SIGKILL: no cleanup code runs in the child
    child.wait().unwrap();
    assert!(!daemon.is_client_alive(idx).unwrap());
    let st = table.status(idx).unwrap();
    assert!(st.is_dead());
    let dead: Vec<_> = table.occupied().filter(|s| s.is_dead()).collect();
    assert_eq!(dead, vec![st]);
    table.reclaim(st).unwrap();
    assert!(table.status(mine.index).unwrap().alive);
    assert!(table.locks_probe_ok());
    local.release_slot(l.slots, 3).unwrap();
    assert_eq!(table.occupied().count(), 0);
}

#[test]
fn slot_table_outside_the_segment_is_its_own_error() {
    let l = layout();
    let n = name("slot-oob");
    let _daemon = Segment::create(&n, l.total_size, 0o600, l.hash).unwrap();
    let client = Segment::open(&n, l.hash).unwrap();
    let past_end = Offset::new(l.total_size);
    let oob = ClaimError::Table(TableOutOfBounds {
        offset: l.total_size,
        count: 3,
    });
    assert_eq!(client.claim_slot(past_end, 3), Err(oob));
    // Too many slots for the segment, at a valid offset.
    assert!(matches!(
        client.claim_slot(l.slots, u32::MAX),
        Err(ClaimError::Table(_))
    ));
    assert!(matches!(
        client.release_slot(past_end, 3),
        Err(SlotError::Table(_))
    ));
    // Nothing was claimed: the real table still has room and no holder.
    let claim = client.claim_slot(l.slots, 3).unwrap();
    assert_eq!(claim.index, 0);
    client.release_slot(l.slots, 3).unwrap();
}

impl<L: SlotLocks> SlotTable<'_, L> {
    fn locks_probe_ok(&self) -> bool {
        self.status(0).is_ok()
    }
}
