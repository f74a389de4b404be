//! Segments found under a daemon's name (`radixd_ipc::Segment`): a file
//! left by a dead daemon, or anything else anyone put there. Whatever its
//! bytes:
//!
//! - with no daemon holding its lock, no client opens it (typed errors);
//! - with a live daemon's lock held, a client opens it exactly when every
//!   header field checks out (magic, ready, version, layout hash, size), and
//!   then reaches no byte outside it;
//! - a daemon starting under the name takes over (replaces) only a radixd
//!   segment whose daemon is gone, is refused beside a live one, and leaves
//!   any other file byte for byte.
//!
//! Input: one control byte (which header fields to forge, so most runs get
//! past the magic; whether a live daemon holds the lock), a region query
//! (two 4-byte words), then the file's bytes.

#![no_main]

use std::fs::File;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use radixd_ipc::liveness::{self, DAEMON_BYTE};
use radixd_ipc::segment::{HEADER_SIZE, HEADER_VERSION, MAGIC};
use radixd_ipc::{CreateError, OpenError, Segment};

const NAME: &str = "s";
/// The layout hash this "build" expects.
const HASH: u64 = 0x5eed_0fa1_1c0d_e000;
/// The size a new daemon's segment has.
const SIZE: u64 = 8192;

static DIR: OnceLock<PathBuf> = OnceLock::new();

/// Removes the directory when the process exits normally; `scripts/fuzz`
/// removes what a crash leaves.
extern "C" fn remove_dir() {
    if let Some(dir) = DIR.get() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

fn dir() -> &'static PathBuf {
    DIR.get_or_init(|| {
        let dir = PathBuf::from(format!(
            "/dev/shm/radixd-fuzz-segment-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("a directory in /dev/shm");
        // SAFETY: `remove_dir` is an `extern "C" fn()` that does not unwind
        // out (its errors are ignored).
        unsafe { libc::atexit(remove_dir) };
        dir
    })
}

fn word(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    if let Some(src) = b.get(at..) {
        let n = src.len().min(8);
        w[..n].copy_from_slice(&src[..n]);
    }
    u64::from_le_bytes(w)
}

fn set(b: &mut [u8], at: usize, bytes: &[u8]) {
    if let Some(dst) = b.get_mut(at..at + bytes.len()) {
        dst.copy_from_slice(bytes);
    }
}

/// Whether a header says what a client of this build must see before it
/// trusts the segment.
fn header_ok(b: &[u8]) -> bool {
    b.len() as u64 >= HEADER_SIZE
        && word(b, 0) == MAGIC
        && word(b, 8) as u32 == HEADER_VERSION
        && word(b, 16) == HASH
        && word(b, 24) == b.len() as u64
        && word(b, 48) as u32 == 1
}

fuzz_target!(|data: &[u8]| {
    let dir = dir();
    if data.len() < 9 {
        return;
    }
    let control = data[0];
    let (offset, len) = (word(&data[1..5], 0), word(&data[5..9], 0));
    let mut bytes = data[9..].to_vec();
    if control & 1 != 0 {
        set(&mut bytes, 0, &MAGIC.to_le_bytes());
    }
    if control & 2 != 0 {
        set(&mut bytes, 8, &HEADER_VERSION.to_le_bytes());
        set(&mut bytes, 48, &1u32.to_le_bytes());
    }
    if control & 4 != 0 {
        set(&mut bytes, 16, &HASH.to_le_bytes());
    }
    if control & 8 != 0 {
        let n = bytes.len() as u64;
        set(&mut bytes, 24, &n.to_le_bytes());
    }
    let path = dir.join(NAME);
    let _ = std::fs::remove_file(&path);
    std::fs::write(&path, &bytes).expect("the file written");
    let is_radixd = word(&bytes, 0) == MAGIC && bytes.len() >= 8;

    // A dead daemon's (or nobody's) file: no client takes it.
    for opened in [
        Segment::open_in(dir, NAME, HASH),
        Segment::open_unverified_in(dir, NAME),
    ] {
        match opened {
            Ok(_) => panic!("a segment without a live daemon opened"),
            Err(e) => {
                assert!(!e.to_string().is_empty());
                if !is_radixd {
                    assert!(
                        matches!(e, OpenError::BadMagic(_) | OpenError::TooSmall { .. }),
                        "{e:?} for a file without the magic"
                    );
                }
            }
        }
    }

    if control & 16 != 0 {
        // A live daemon holds the lock.
        let daemon = File::options()
            .read(true)
            .write(true)
            .open(&path)
            .expect("the file opened");
        assert!(liveness::try_lock(daemon.as_fd(), DAEMON_BYTE).expect("a lock"));
        match Segment::open_in(dir, NAME, HASH) {
            Ok(seg) => {
                assert!(header_ok(&bytes), "a client trusted a bad header");
                assert_eq!(seg.len(), bytes.len() as u64);
                assert!(!seg.is_owner());
                match seg.region(offset, len) {
                    Ok(_) => assert!(offset + len <= seg.len(), "a region outside the segment"),
                    Err(e) => assert!(
                        offset.checked_add(len).is_none_or(|end| end > seg.len()),
                        "{e}"
                    ),
                }
            }
            Err(e) => assert!(!header_ok(&bytes), "a good header refused: {e:?}"),
        }
        // Beside a live daemon, a new one takes nothing over.
        match Segment::create_in(dir, NAME, SIZE, 0o600, HASH) {
            Ok(_) => panic!("took over a live daemon's name"),
            Err(CreateError::AlreadyRunning) => assert!(is_radixd),
            Err(CreateError::NotASegment) => assert!(!is_radixd),
            Err(e) => panic!("{e:?}"),
        }
        assert_eq!(std::fs::read(&path).expect("still there"), bytes);
        drop(daemon);
    }

    // A daemon starting under the name.
    match Segment::create_in(dir, NAME, SIZE, 0o600, HASH) {
        Ok(seg) => {
            assert!(is_radixd, "took over a file that is not a radixd segment");
            assert!(seg.is_owner());
            assert_eq!(seg.len(), SIZE);
            let info = seg.info();
            assert_eq!((info.layout_hash, info.total_size), (HASH, SIZE));
            assert_eq!(info.daemon_pid, u64::from(std::process::id()));
            let client = Segment::open_in(dir, NAME, HASH).expect("the new segment opens");
            assert_eq!(client.info(), info);
            drop(client);
            drop(seg);
            assert!(!path.exists(), "the daemon's segment outlived it");
        }
        Err(CreateError::NotASegment) => {
            assert!(!is_radixd, "a dead daemon's segment was not taken over");
            assert_eq!(std::fs::read(&path).expect("left alone"), bytes);
        }
        Err(e) => panic!("{e:?}"),
    }
    let _ = std::fs::remove_file(&path);
});
