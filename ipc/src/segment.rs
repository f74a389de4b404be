//! A named shared-memory segment: a plain file under `/dev/shm`, mapped with
//! `memmap2::MmapRaw`, with a checked header at offset 0.
//!
//! Creation builds the whole segment under a temporary name (created
//! `O_EXCL` with an explicit mode, sized, daemon lock taken, header written,
//! `ready` set last) and then publishes it with `link(2)`, which fails if the
//! name exists: a client never sees a half-built segment, and two daemons
//! never both own a name. An existing name whose daemon lock is free is a
//! stale segment from a dead daemon: it is unlinked and replaced.

use core::fmt;
use core::ptr::NonNull;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use memmap2::MmapRaw;

use crate::liveness::{self, OfdLocks, DAEMON_BYTE};
use crate::scratch::Scratch;
use crate::shm::{Offset, ShmSafe};
use crate::slots::{
    Claim, ClaimError, ClientSlot, LivenessError, SlotError, SlotTable, TableOutOfBounds,
};
use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// Magic number at offset 0 ("RADIXSHM", little-endian).
pub const MAGIC: u64 = u64::from_le_bytes(*b"RADIXSHM");
/// Version of this crate's segment header layout.
pub const LAYOUT_VERSION: u32 = 1;
/// Directory holding segments.
pub const SHM_DIR: &str = "/dev/shm";
/// Size of [`SegmentHeader`]; user regions start at or after it.
pub const HEADER_SIZE: u64 = 64;

/// Header at offset 0 of every segment. Written once by the creator before
/// `ready` is set; read-only afterwards.
#[repr(C)]
#[derive(Debug)]
pub struct SegmentHeader {
    magic: AtomicU64,
    version: AtomicU32,
    _pad0: u32,
    layout_hash: AtomicU64,
    total_size: AtomicU64,
    daemon_pid: AtomicU64,
    incarnation: AtomicU64,
    /// Set to 1 last, with Release; pairs with Acquire in `open`.
    ready: AtomicU32,
    _pad1: u32,
    _reserved: u64,
}

const _: () = assert!(size_of::<SegmentHeader>() as u64 == HEADER_SIZE);

// SAFETY: std atomics and never-accessed padding; every bit pattern valid.
unsafe impl ShmSafe for SegmentHeader {}

/// What a segment's header says about its creator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeaderInfo {
    /// Header layout version.
    pub version: u32,
    /// Layout hash supplied by the creator.
    pub layout_hash: u64,
    /// Total mapped size in bytes.
    pub total_size: u64,
    /// Pid of the daemon that created the segment (informational).
    pub daemon_pid: u64,
    /// Value new for every daemon start.
    pub incarnation: u64,
}

/// Errors of [`Segment::create`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateError {
    /// Name empty, too long, or containing `/` or NUL, or starting with `.`.
    InvalidName,
    /// Size below [`HEADER_SIZE`] or not representable.
    InvalidSize(u64),
    /// A live daemon owns the name.
    AlreadyRunning,
    /// The name is taken by a file that is not provably a radixd segment
    /// (another program's file, a directory, a link): it is left alone.
    NotASegment,
    /// The file system holding segments has too little room.
    NoSpace {
        /// Bytes the segment needs.
        needed: u64,
        /// Bytes free for an unprivileged user when creation was tried.
        free: u64,
    },
    /// The OS refused access (e.g. another user's segment).
    PermissionDenied,
    /// Any other OS error.
    Io(io::ErrorKind),
}

/// Errors of [`Segment::open`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenError {
    /// Name empty, too long, or containing `/` or NUL, or starting with `.`.
    InvalidName,
    /// No segment of that name.
    NotFound,
    /// Not allowed to open it.
    PermissionDenied,
    /// Smaller than its header or than the size its header claims.
    TooSmall {
        /// Size of the file.
        file: u64,
        /// Size required.
        needed: u64,
    },
    /// Header not marked ready.
    NotReady,
    /// Not a radixd segment.
    BadMagic(u64),
    /// Header layout version differs.
    VersionMismatch {
        /// Our version.
        expected: u32,
        /// The segment's.
        found: u32,
    },
    /// The creator's layout hash differs from ours (different build/config).
    LayoutMismatch {
        /// Our hash.
        expected: u64,
        /// The segment's.
        found: u64,
    },
    /// The daemon that created it is dead (stale segment).
    DaemonDead,
    /// Any other OS error.
    Io(io::ErrorKind),
}

/// Errors of region resolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegionError {
    /// `offset + len` overflows or exceeds the segment.
    OutOfBounds {
        /// Requested offset.
        offset: u64,
        /// Requested length in bytes.
        len: u64,
        /// Segment size.
        size: u64,
    },
    /// Offset not aligned for the requested type.
    Misaligned {
        /// Requested offset.
        offset: u64,
        /// Required alignment.
        align: u64,
    },
}

impl fmt::Display for CreateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidName => f.write_str("invalid segment name"),
            Self::InvalidSize(s) => write!(f, "invalid segment size {s}"),
            Self::AlreadyRunning => f.write_str("a live daemon already owns this segment"),
            Self::NotASegment => f.write_str(
                "the name is taken by a file that is not a radixd segment; it was left alone",
            ),
            Self::NoSpace { needed, free } => write!(
                f,
                "the segment needs {} but only {} are free there (enlarge the tmpfs, \
                 e.g. docker --shm-size, or lower --capacity/--scratch-bytes)",
                human_bytes(*needed),
                human_bytes(*free)
            ),
            Self::PermissionDenied => f.write_str("permission denied creating segment"),
            Self::Io(k) => write!(f, "creating segment: {k}"),
        }
    }
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidName => f.write_str("invalid segment name"),
            Self::NotFound => f.write_str("no such segment (is the daemon running?)"),
            Self::PermissionDenied => f.write_str("permission denied opening segment"),
            Self::TooSmall { file, needed } if *needed == HEADER_SIZE => {
                write!(
                    f,
                    "not a radixd segment ({file} bytes, smaller than a header)"
                )
            }
            Self::TooSmall { file, needed } => {
                write!(f, "segment is {file} bytes, its header says {needed}")
            }
            Self::NotReady => f.write_str("segment header not ready"),
            Self::BadMagic(m) => write!(f, "not a radixd segment (magic {m:#x})"),
            Self::VersionMismatch { expected, found } => {
                write!(f, "segment layout version {found}, expected {expected}")
            }
            Self::LayoutMismatch { expected, found } => {
                write!(f, "segment layout hash {found:#x}, expected {expected:#x} (different build or config)")
            }
            Self::DaemonDead => f.write_str("the daemon that created the segment is dead"),
            Self::Io(k) => write!(f, "opening segment: {k}"),
        }
    }
}

impl fmt::Display for RegionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::OutOfBounds { offset, len, size } => {
                write!(f, "region {offset}+{len} outside segment of {size} bytes")
            }
            Self::Misaligned { offset, align } => {
                write!(f, "offset {offset} not aligned to {align}")
            }
        }
    }
}

impl std::error::Error for CreateError {}
impl std::error::Error for OpenError {}
impl std::error::Error for RegionError {}

impl From<io::Error> for CreateError {
    fn from(e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::PermissionDenied => Self::PermissionDenied,
            k => Self::Io(k),
        }
    }
}

impl From<io::Error> for OpenError {
    fn from(e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::NotFound => Self::NotFound,
            io::ErrorKind::PermissionDenied => Self::PermissionDenied,
            k => Self::Io(k),
        }
    }
}

/// `bytes` for people: "279.3 MiB".
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} bytes")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Bytes an unprivileged user may still allocate in the file system of `dir`.
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: `statvfs` is a plain C struct for which all zero is valid.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and `st` a valid out-pointer.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}

/// Gives `file` `size` bytes of real storage now, so that a full tmpfs is a
/// clean error here instead of a SIGBUS at the first touch of a sparse page.
fn reserve(file: &File, dir: &Path, size: u64) -> Result<(), CreateError> {
    use std::os::fd::AsRawFd;
    let len = libc::off_t::try_from(size).map_err(|_| CreateError::InvalidSize(size))?;
    // SAFETY: `file` is an open, writable descriptor for the call's duration.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
    match rc {
        0 => Ok(()),
        libc::ENOSPC | libc::EFBIG => Err(CreateError::NoSpace {
            needed: size,
            free: free_bytes(dir).unwrap_or(0),
        }),
        // A file system without fallocate: glibc already fell back to
        // writing; anything else is an ordinary I/O error.
        e => Err(io::Error::from_raw_os_error(e).into()),
    }
}

/// Opens an existing file for reading and writing without following a
/// symbolic link or blocking on a FIFO, and only if it is a regular file.
/// `Ok(None)` for anything else under the name.
fn open_regular(path: &Path) -> io::Result<Option<File>> {
    let opened = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path);
    match opened {
        Ok(file) => Ok(file.metadata()?.is_file().then_some(file)),
        // A directory, a symbolic link, a device without a reader.
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EISDIR | libc::ELOOP | libc::ENXIO)
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 200 && !name.starts_with('.') && !name.contains(['/', '\0'])
}

/// A mapped segment. The creator (daemon) unlinks it on drop.
#[derive(Debug)]
pub struct Segment {
    map: MmapRaw,
    file: File,
    path: PathBuf,
    /// `(dev, ino)` of our file, to never unlink someone else's.
    id: (u64, u64),
    owner: bool,
    claim: Mutex<Option<Claim>>,
}

/// Removes a temporary file on early return.
struct TmpGuard(Option<PathBuf>);

impl Drop for TmpGuard {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn incarnation() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    // Mix in the pid so two daemons started in the same nanosecond differ.
    (nanos ^ (u64::from(std::process::id()) << 40)) | 1
}

impl Segment {
    /// Creates segment `name` of `size` bytes with permission bits `mode`
    /// (0o600 for the daemon's user only, 0o660 to admit its group), stamped
    /// with `layout_hash`. Takes over a stale segment left by a dead daemon;
    /// fails with [`CreateError::AlreadyRunning`] if its daemon is alive.
    pub fn create(
        name: &str,
        size: u64,
        mode: u32,
        layout_hash: u64,
    ) -> Result<Segment, CreateError> {
        Self::create_in(Path::new(SHM_DIR), name, size, mode, layout_hash)
    }

    /// [`Segment::create`] in directory `dir` (tests, non-default tmpfs).
    pub fn create_in(
        dir: &Path,
        name: &str,
        size: u64,
        mode: u32,
        layout_hash: u64,
    ) -> Result<Segment, CreateError> {
        if !valid_name(name) {
            return Err(CreateError::InvalidName);
        }
        let len = usize::try_from(size).map_err(|_| CreateError::InvalidSize(size))?;
        if size < HEADER_SIZE || isize::try_from(len).is_err() {
            return Err(CreateError::InvalidSize(size));
        }
        let path = dir.join(name);
        let tmp = dir.join(format!(
            ".{name}.{}.{:x}",
            std::process::id(),
            incarnation()
        ));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true) // O_CREAT | O_EXCL
            .mode(mode & 0o777)
            .custom_flags(libc::O_CLOEXEC)
            .open(&tmp)?;
        let mut guard = TmpGuard(Some(tmp.clone()));
        // Explicit chmod: the umask may have masked bits of `mode`.
        file.set_permissions(std::fs::Permissions::from_mode(mode & 0o777))?;
        reserve(&file, dir, size)?;
        if !liveness::try_lock(file.as_fd(), DAEMON_BYTE)? {
            return Err(CreateError::Io(io::ErrorKind::WouldBlock));
        }
        let map = memmap2::MmapOptions::new().len(len).map_raw(&file)?;
        let meta = file.metadata()?;
        let seg = Segment {
            map,
            file,
            path,
            id: (meta.dev(), meta.ino()),
            owner: false, // becomes the owner once published under `name`
            claim: Mutex::new(None),
        };
        let h = seg.header();
        // Relaxed: all published by the Release store of `ready` below.
        h.magic.store(MAGIC, Ordering::Relaxed);
        h.version.store(LAYOUT_VERSION, Ordering::Relaxed);
        h.layout_hash.store(layout_hash, Ordering::Relaxed);
        h.total_size.store(size, Ordering::Relaxed);
        h.daemon_pid
            .store(u64::from(std::process::id()), Ordering::Relaxed);
        h.incarnation.store(incarnation(), Ordering::Relaxed);
        // Release: publishes the header; pairs with Acquire in `open`.
        h.ready.store(1, Ordering::Release);

        let mut seg = seg;
        // A few attempts: after a stale segment is removed, the link must win
        // unless another daemon raced us to it.
        for _ in 0..3 {
            match std::fs::hard_link(&tmp, &seg.path) {
                Ok(()) => {
                    seg.owner = true;
                    drop(guard.0.take().map(std::fs::remove_file));
                    return Ok(seg);
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => remove_stale(&seg.path)?,
                Err(e) => return Err(e.into()),
            }
        }
        Err(CreateError::AlreadyRunning)
    }

    /// Opens segment `name`, refusing a wrong magic, version or layout hash,
    /// a truncated file, or a segment whose daemon is dead.
    pub fn open(name: &str, layout_hash: u64) -> Result<Segment, OpenError> {
        Self::open_in(Path::new(SHM_DIR), name, layout_hash)
    }

    /// [`Segment::open`] in directory `dir`.
    pub fn open_in(dir: &Path, name: &str, layout_hash: u64) -> Result<Segment, OpenError> {
        Self::open_checked(dir, name, Some(layout_hash))
    }

    /// Opens segment `name` checking everything [`Segment::open`] does but
    /// the layout hash, for a peer that learns the layout from the segment
    /// itself; it must then compare its own hash with [`Segment::info`].
    pub fn open_unverified(name: &str) -> Result<Segment, OpenError> {
        Self::open_checked(Path::new(SHM_DIR), name, None)
    }

    /// [`Segment::open_unverified`] in directory `dir`.
    pub fn open_unverified_in(dir: &Path, name: &str) -> Result<Segment, OpenError> {
        Self::open_checked(dir, name, None)
    }

    fn open_checked(
        dir: &Path,
        name: &str,
        layout_hash: Option<u64>,
    ) -> Result<Segment, OpenError> {
        if !valid_name(name) {
            return Err(OpenError::InvalidName);
        }
        let path = dir.join(name);
        let file = open_regular(&path)?.ok_or(OpenError::BadMagic(0))?;
        let meta = file.metadata()?;
        let file_len = meta.len();
        if file_len < HEADER_SIZE {
            return Err(OpenError::TooSmall {
                file: file_len,
                needed: HEADER_SIZE,
            });
        }
        let len =
            usize::try_from(file_len).map_err(|_| OpenError::Io(io::ErrorKind::InvalidData))?;
        let map = memmap2::MmapOptions::new().len(len).map_raw(&file)?;
        let seg = Segment {
            map,
            file,
            path,
            id: (meta.dev(), meta.ino()),
            owner: false,
            claim: Mutex::new(None),
        };
        let h = seg.header();
        // Magic first: a foreign file is "not a radixd segment", whatever
        // its other bytes say. Relaxed: a name is only ever linked to a
        // segment whose header is complete (see `create`), so the magic of a
        // real segment is never seen half-written.
        let magic = h.magic.load(Ordering::Relaxed);
        if magic != MAGIC {
            return Err(OpenError::BadMagic(magic));
        }
        // Acquire: pairs with the Release store of `ready` in `create`.
        if h.ready.load(Ordering::Acquire) != 1 {
            return Err(OpenError::NotReady);
        }
        let info = seg.info();
        if info.version != LAYOUT_VERSION {
            return Err(OpenError::VersionMismatch {
                expected: LAYOUT_VERSION,
                found: info.version,
            });
        }
        if let Some(expected) = layout_hash.filter(|&h| h != info.layout_hash) {
            return Err(OpenError::LayoutMismatch {
                expected,
                found: info.layout_hash,
            });
        }
        if info.total_size != file_len {
            return Err(OpenError::TooSmall {
                file: file_len,
                needed: info.total_size,
            });
        }
        if !seg.is_daemon_alive().map_err(|e| OpenError::Io(e.0))? {
            return Err(OpenError::DaemonDead);
        }
        Ok(seg)
    }

    fn header(&self) -> &SegmentHeader {
        // SAFETY: the mapping is page-aligned and at least HEADER_SIZE bytes
        // (checked by create/open), and `SegmentHeader` is `ShmSafe`: atomics
        // valid for any bit pattern, so a shared reference is sound while
        // peers write.
        unsafe { &*self.map.as_ptr().cast::<SegmentHeader>() }
    }

    /// The header's contents.
    pub fn info(&self) -> HeaderInfo {
        let h = self.header();
        // Relaxed: immutable after `ready`, which create/open ordered.
        HeaderInfo {
            version: h.version.load(Ordering::Relaxed),
            layout_hash: h.layout_hash.load(Ordering::Relaxed),
            total_size: h.total_size.load(Ordering::Relaxed),
            daemon_pid: h.daemon_pid.load(Ordering::Relaxed),
            incarnation: h.incarnation.load(Ordering::Relaxed),
        }
    }

    /// Size of the mapping in bytes.
    pub fn len(&self) -> u64 {
        self.map.len() as u64
    }

    /// Always false: a segment holds at least its header.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Path of the segment file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether this handle created the segment (and unlinks it on drop).
    pub fn is_owner(&self) -> bool {
        self.owner
    }

    /// Whether the daemon holding the segment's lock is alive. For the
    /// creator itself this reports false (own locks are invisible to it).
    pub fn is_daemon_alive(&self) -> Result<bool, LivenessError> {
        Ok(liveness::is_locked(self.file.as_fd(), DAEMON_BYTE)?)
    }

    /// Whether the client in slot `index` holds its liveness lock (probed
    /// through this handle's own file description).
    pub fn is_client_alive(&self, index: u32) -> Result<bool, LivenessError> {
        Ok(liveness::is_locked(
            self.file.as_fd(),
            liveness::client_byte(index),
        )?)
    }

    /// Bounds-checked pointer to `len` bytes at `offset`.
    pub fn region(&self, offset: u64, len: u64) -> Result<NonNull<u8>, RegionError> {
        let size = self.len();
        let oob = RegionError::OutOfBounds { offset, len, size };
        let end = offset.checked_add(len).ok_or(oob)?;
        if end > size {
            return Err(oob);
        }
        let off = usize::try_from(offset).map_err(|_| oob)?;
        // SAFETY: `offset <= size`, so the result stays within (or one past)
        // the mapping.
        let ptr = unsafe { self.map.as_mut_ptr().add(off) };
        NonNull::new(ptr).ok_or(oob)
    }

    fn typed<T>(&self, offset: u64, count: u64) -> Result<NonNull<T>, RegionError> {
        let align = align_of::<T>() as u64;
        if offset % align != 0 {
            return Err(RegionError::Misaligned { offset, align });
        }
        let size = self.len();
        let bytes = (size_of::<T>() as u64)
            .checked_mul(count)
            .ok_or(RegionError::OutOfBounds {
                offset,
                len: u64::MAX,
                size,
            })?;
        Ok(self.region(offset, bytes)?.cast())
    }

    /// A checked shared reference to the `T` at `offset`.
    pub fn get<T: ShmSafe>(&self, offset: Offset<T>) -> Result<&T, RegionError> {
        let ptr = self.typed::<T>(offset.get(), 1)?;
        // SAFETY: in bounds and aligned (checked; the mapping is page
        // aligned), lives as long as `self`, and `T: ShmSafe` is valid for
        // any bits and only mutated through atomics/UnsafeCell.
        Ok(unsafe { ptr.as_ref() })
    }

    /// A checked shared slice of `count` `T`s at `offset`.
    pub fn slice<T: ShmSafe>(&self, offset: Offset<T>, count: u64) -> Result<&[T], RegionError> {
        let ptr = self.typed::<T>(offset.get(), count)?;
        let n = usize::try_from(count).map_err(|_| RegionError::OutOfBounds {
            offset: offset.get(),
            len: count,
            size: self.len(),
        })?;
        // SAFETY: as in `get`, for `count` contiguous elements.
        Ok(unsafe { core::slice::from_raw_parts(ptr.as_ptr(), n) })
    }

    /// A bounds-checked scratch region of `len` bytes at `offset`.
    pub fn scratch(&self, offset: u64, len: u64) -> Result<Scratch<'_>, RegionError> {
        let ptr = self.region(offset, len)?;
        // SAFETY: `region` checked that `len` bytes at `ptr` lie within the
        // mapping, which outlives the returned borrow of `self`.
        Ok(unsafe { Scratch::from_raw(ptr, len) })
    }

    /// The client slot table at `offset` (`count` slots), probing liveness
    /// through this handle.
    pub fn slots(
        &self,
        offset: Offset<ClientSlot>,
        count: u32,
    ) -> Result<SlotTable<'_, OfdLocks<'_>>, RegionError> {
        let slots = self.slice(offset, u64::from(count))?;
        Ok(SlotTable::new(slots, OfdLocks::new(self.file.as_fd())))
    }

    /// The slot table for this process's own claim.
    fn own_slots(
        &self,
        offset: Offset<ClientSlot>,
        count: u32,
    ) -> Result<SlotTable<'_, OfdLocks<'_>>, TableOutOfBounds> {
        self.slots(offset, count).map_err(|_| TableOutOfBounds {
            offset: offset.get(),
            count,
        })
    }

    /// Claims a client slot for this process (at most one per handle) and
    /// publishes the claim; the daemon adopts it (resets its rings, marks it
    /// ACTIVE) before it may be used: see [`Segment::is_adopted`].
    pub fn claim_slot(&self, offset: Offset<ClientSlot>, count: u32) -> Result<Claim, ClaimError> {
        let table = self.own_slots(offset, count)?;
        let mut held = self.claim.lock().unwrap_or_else(|p| p.into_inner());
        if held.is_some() {
            return Err(ClaimError::AlreadyClaimed);
        }
        let claim = table.claim(std::process::id())?;
        *held = Some(claim);
        Ok(claim)
    }

    /// Whether the daemon has adopted this handle's claim (its rings are
    /// reset and published); false without a claim.
    pub fn is_adopted(&self, offset: Offset<ClientSlot>, count: u32) -> bool {
        let held = *self.claim.lock().unwrap_or_else(|p| p.into_inner());
        match (held, self.own_slots(offset, count)) {
            (Some(claim), Ok(table)) => table.is_current(claim),
            _ => false,
        }
    }

    /// Releases the claim taken by [`Segment::claim_slot`].
    pub fn release_slot(&self, offset: Offset<ClientSlot>, count: u32) -> Result<(), SlotError> {
        let table = self.own_slots(offset, count)?;
        let mut held = self.claim.lock().unwrap_or_else(|p| p.into_inner());
        match held.take() {
            Some(claim) => table.release(claim),
            None => Err(SlotError::Stale),
        }
    }
}

/// Removes `path` if it provably is a stale radixd segment: a regular file
/// with radixd's magic whose daemon lock is free. Anything else under the
/// name is left alone ([`CreateError::NotASegment`]).
///
/// The probe and the unlink happen while this process holds the stale
/// file's daemon lock, so two daemons taking over at once cannot both get
/// past the probe, and a fresh segment published meanwhile (by `link`,
/// which never replaces a name) cannot be the file unlinked: the unlink is
/// checked against the very inode that was probed and locked.
fn remove_stale(path: &Path) -> Result<(), CreateError> {
    let existing = match open_regular(path) {
        Ok(Some(f)) => f,
        Ok(None) => return Err(CreateError::NotASegment),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let mut magic = [0u8; 8];
    {
        use std::os::unix::fs::FileExt;
        match existing.read_exact_at(&mut magic, 0) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Err(CreateError::NotASegment)
            }
            Err(e) => return Err(e.into()),
        }
    }
    if u64::from_le_bytes(magic) != MAGIC {
        return Err(CreateError::NotASegment);
    }
    // Taking the daemon lock both proves the old daemon dead and keeps any
    // other daemon from taking the same file over until we are done.
    if !liveness::try_lock(existing.as_fd(), DAEMON_BYTE)? {
        return Err(CreateError::AlreadyRunning);
    }
    let probed = existing.metadata()?;
    match std::fs::symlink_metadata(path) {
        Ok(now) if now.dev() == probed.dev() && now.ino() == probed.ino() => {
            match std::fs::remove_file(path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e.into()),
                _ => Ok(()),
            }
        }
        _ => Ok(()),
    }
    // Dropping `existing` releases the lock on the unlinked file.
}

impl Drop for Segment {
    fn drop(&mut self) {
        if self.owner {
            if let Ok(meta) = std::fs::metadata(&self.path) {
                if (meta.dev(), meta.ino()) == self.id {
                    let _ = std::fs::remove_file(&self.path);
                }
            }
        }
        // Closing `file` (after this) drops our OFD locks.
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::layout::{LayoutConfig, SegmentLayout};
    use crate::ring::{Consumer, Producer, RingError, RingHeader};
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
                expected: LAYOUT_VERSION,
                found: 99
            })
        );
        bytes[8..12].copy_from_slice(&LAYOUT_VERSION.to_le_bytes());
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
                match q.pop().unwrap() {
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
    fn corrupt_ring_in_shared_memory_is_an_error() {
        let l = layout();
        let n = name("corrupt");
        let seg = Segment::create(&n, l.total_size, 0o600, l.hash).unwrap();
        let c = l.client(0).unwrap();
        // A hostile peer scribbles over the ring state and slots.
        let raw = seg.region(c.request_header.get(), 256 + 8 * 16).unwrap();
        // SAFETY: in bounds (checked by `region`); plain bytes.
        unsafe { raw.as_ptr().write_bytes(0xee, 256 + 8 * 16) };
        let h = seg.get(c.request_header).unwrap();
        let slots = seg.slice(c.request_slots, 8).unwrap();
        // SAFETY: single consumer in this test.
        let q = unsafe { Consumer::<Msg>::new(h, slots) }.unwrap();
        // head == tail (both 0xeeee..), so empty: garbage of equal counters is benign.
        assert_eq!(q.pop(), Ok(None));
        let head = c.request_header.get();
        // SAFETY: in bounds; head is the first u64 of the header.
        unsafe { seg.region(head, 8).unwrap().cast::<u64>().as_ptr().write(7) };
        assert_eq!(
            q.pop(),
            Err(RingError::Corrupt {
                head: 7,
                tail: 0xeeee_eeee_eeee_eeee
            })
        );
        // SAFETY: as above.
        unsafe {
            seg.region(head, 8)
                .unwrap()
                .cast::<u64>()
                .as_ptr()
                .write(0xeeee_eeee_eeee_eef0)
        };
        // Two garbage messages in range: delivered as plain data, no panic.
        assert_eq!(q.pop(), Ok(Some([0xeeee_eeee_eeee_eeee; 2])));
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
}
