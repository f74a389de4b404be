//! Process liveness that survives pid reuse: open-file-description (OFD)
//! byte-range locks on the segment file.
//!
//! The daemon holds a write lock on byte [`DAEMON_BYTE`] for its lifetime;
//! client slot `i` holds one on byte `client_byte(i)`, taken before the slot
//! claim is published. A peer probes with `F_OFD_GETLK` through its own open
//! file description. The kernel drops OFD locks when the last descriptor of
//! the description closes, i.e. when the process dies, whatever its pid later
//! becomes. (`kill(pid, 0)` would be fooled by pid reuse.)

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use crate::slots::{LivenessError, SlotLocks};

/// Byte locked by the daemon.
pub const DAEMON_BYTE: u64 = 0;

/// Byte locked by the client in slot `index`.
pub fn client_byte(index: u32) -> u64 {
    1 + u64::from(index)
}

fn flock_for(byte: u64, kind: libc::c_short) -> io::Result<libc::flock> {
    // SAFETY: `flock` is a plain C struct for which all zero is valid.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start =
        libc::off_t::try_from(byte).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    fl.l_len = 1;
    fl.l_pid = 0; // required by F_OFD_*
    Ok(fl)
}

/// Tries to take an exclusive OFD lock on `byte`; `Ok(false)` when another
/// open file description holds a conflicting lock.
pub fn try_lock(fd: BorrowedFd<'_>, byte: u64) -> io::Result<bool> {
    let fl = flock_for(byte, libc::F_WRLCK as libc::c_short)?;
    // SAFETY: `fd` is a valid open descriptor for the call's duration and
    // `fl` is a properly initialised `flock`.
    let rc = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
    if rc == 0 {
        return Ok(true);
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(false),
        _ => Err(err),
    }
}

/// Releases our OFD lock on `byte` (no-op if we hold none).
pub fn unlock(fd: BorrowedFd<'_>, byte: u64) -> io::Result<()> {
    let fl = flock_for(byte, libc::F_UNLCK as libc::c_short)?;
    // SAFETY: as in `try_lock`.
    let rc = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether an open file description OTHER than `fd`'s holds a lock on
/// `byte` (our own locks never conflict with our own probe).
pub fn is_locked(fd: BorrowedFd<'_>, byte: u64) -> io::Result<bool> {
    let mut fl = flock_for(byte, libc::F_WRLCK as libc::c_short)?;
    // SAFETY: as in `try_lock`; the kernel writes the result into `fl`.
    let rc = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
}

/// [`SlotLocks`] over OFD locks on one open file description of the segment.
#[derive(Clone, Copy, Debug)]
pub struct OfdLocks<'a> {
    fd: BorrowedFd<'a>,
}

impl<'a> OfdLocks<'a> {
    /// Locks on the file description behind `fd`.
    pub fn new(fd: BorrowedFd<'a>) -> Self {
        Self { fd }
    }
}

impl SlotLocks for OfdLocks<'_> {
    fn try_lock(&self, index: u32) -> Result<bool, LivenessError> {
        Ok(try_lock(self.fd, client_byte(index))?)
    }

    fn unlock(&self, index: u32) -> Result<(), LivenessError> {
        Ok(unlock(self.fd, client_byte(index))?)
    }

    fn is_held(&self, index: u32) -> Result<bool, LivenessError> {
        Ok(is_locked(self.fd, client_byte(index))?)
    }
}
