//! A plain file in shared memory that outlives its creator, mapped whole by
//! its owner and in two parts by its users: a read-only head and a
//! read-write tail. Unlike [`crate::Segment`] it has no header of its own
//! and no liveness lock: whoever uses it keeps its own header inside and
//! decides whether an existing file can be trusted (a daemon that adopts
//! what its predecessor left).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use memmap2::{MmapOptions, MmapRaw};

/// Why a mapped file could not be created, opened or mapped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MapError {
    /// No file of that name.
    NotFound,
    /// A file of that name exists already (`create`).
    Exists,
    /// Not a regular file (a link, a directory, a FIFO).
    NotRegular,
    /// The file is not as long as asked.
    Length {
        expected: u64,
        found: u64,
    },
    /// A range outside the file, or unaligned.
    Range {
        offset: u64,
        len: u64,
    },
    /// The file system has too little room (`free`: what it had, when
    /// known).
    NoSpace {
        needed: u64,
        free: Option<u64>,
    },
    Io(io::ErrorKind, String),
}

impl std::fmt::Display for MapError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotFound => f.write_str("no such file"),
            Self::Exists => f.write_str("the file exists already"),
            Self::NotRegular => f.write_str("not a regular file"),
            Self::Length { expected, found } => {
                write!(f, "the file holds {found} bytes, not {expected}")
            }
            Self::Range { offset, len } => {
                write!(
                    f,
                    "{len} bytes at {offset} lie outside the file or off a page"
                )
            }
            Self::NoSpace {
                needed,
                free: Some(free),
            } => write!(f, "no room for {needed} bytes ({free} free)"),
            Self::NoSpace { needed, free: None } => write!(f, "no room for {needed} bytes"),
            Self::Io(_, m) => f.write_str(m),
        }
    }
}

impl std::error::Error for MapError {}

impl From<io::Error> for MapError {
    fn from(e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::NotFound => Self::NotFound,
            io::ErrorKind::AlreadyExists => Self::Exists,
            kind => Self::Io(kind, e.to_string()),
        }
    }
}

/// Page size the parts are cut at.
pub const MAP_ALIGN: u64 = 4096;

/// An open shared file (not yet mapped).
#[derive(Debug)]
pub struct MappedFile {
    file: File,
    path: PathBuf,
    len: u64,
}

/// One mapped part of a [`MappedFile`]; unmapped on drop.
#[derive(Debug)]
pub struct Part {
    map: MmapRaw,
}

impl Part {
    /// The first byte.
    pub fn base(&self) -> NonNull<u8> {
        // SAFETY: a mapping's address is never null.
        unsafe { NonNull::new_unchecked(self.map.as_mut_ptr()) }
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether nothing is mapped.
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// Asks the kernel for transparent huge pages over the part (shmem THP
    /// obeys `/sys/kernel/mm/transparent_hugepage/shmem_enabled`: with
    /// `advise` this turns them on, with `never` it does nothing); whether
    /// the advice was taken.
    pub fn advise_huge(&self) -> bool {
        // SAFETY: the range is exactly this live mapping; the advice changes
        // no contents.
        unsafe {
            libc::madvise(
                self.map.as_mut_ptr().cast(),
                self.map.len(),
                libc::MADV_HUGEPAGE,
            ) == 0
        }
    }
}

impl MappedFile {
    /// Creates `path` (`O_EXCL`, permission bits `mode`) of `len` bytes,
    /// all reserved now (a full tmpfs fails here, not with a SIGBUS later).
    pub fn create(path: &Path, len: u64, mode: u32) -> Result<Self, MapError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(mode & 0o777)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(path)?;
        let made = Self {
            file,
            path: path.to_owned(),
            len,
        };
        let reserved = (|| {
            // Explicit chmod: the umask may have masked bits of `mode`.
            made.file
                .set_permissions(std::fs::Permissions::from_mode(mode & 0o777))?;
            made.reserve()
        })();
        if let Err(e) = reserved {
            drop(std::fs::remove_file(path));
            return Err(e);
        }
        Ok(made)
    }

    fn reserve(&self) -> Result<(), MapError> {
        use std::os::fd::AsRawFd;
        let no_space = |free| MapError::NoSpace {
            needed: self.len,
            free,
        };
        let len = libc::off_t::try_from(self.len).map_err(|_| no_space(None))?;
        // Refuse what cannot fit before asking for it: on tmpfs, fallocate
        // takes page after page of RAM until it fails, so a request larger
        // than the free room would first squeeze every other process of
        // the host (the OOM killer picks them, not us). fallocate still
        // guards the race with other allocations below.
        if let Some(free) = self.free_bytes().filter(|&free| free < self.len) {
            return Err(no_space(Some(free)));
        }
        // SAFETY: `file` is an open, writable descriptor for the call's
        // duration.
        match unsafe { libc::posix_fallocate(self.file.as_raw_fd(), 0, len) } {
            0 => Ok(()),
            libc::ENOSPC | libc::EFBIG => Err(no_space(self.free_bytes())),
            e => Err(io::Error::from_raw_os_error(e).into()),
        }
    }

    /// Bytes an unprivileged user may still allocate in the file's file
    /// system (`None`: unknown).
    fn free_bytes(&self) -> Option<u64> {
        use std::os::fd::AsRawFd;
        // SAFETY: `statvfs` is a plain C struct for which all zero is valid.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: the descriptor is open for the call; `st` is a valid
        // out-pointer.
        if unsafe { libc::fstatvfs(self.file.as_raw_fd(), &mut st) } != 0 {
            return None;
        }
        Some(st.f_bavail.saturating_mul(st.f_frsize))
    }

    /// Opens the existing regular file `path`, read-write (without
    /// following a link or blocking on a FIFO).
    pub fn open(path: &Path) -> Result<Self, MapError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP | libc::EISDIR | libc::ENXIO) => MapError::NotRegular,
                _ => e.into(),
            })?;
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(MapError::NotRegular);
        }
        Ok(Self {
            file,
            path: path.to_owned(),
            len: meta.len(),
        })
    }

    /// The file's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where the file lies.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Maps `len` bytes at `offset` (both page aligned, inside the file),
    /// read-write or read-only.
    pub fn map(&self, offset: u64, len: u64, writable: bool) -> Result<Part, MapError> {
        let bad = MapError::Range { offset, len };
        let end = offset.checked_add(len).ok_or(bad.clone())?;
        if end > self.len || offset % MAP_ALIGN != 0 || len == 0 {
            return Err(bad);
        }
        let len = usize::try_from(len).map_err(|_| bad)?;
        let mut options = MmapOptions::new();
        options.offset(offset).len(len);
        let map = if writable {
            options.map_raw(&self.file)?
        } else {
            options.map_raw_read_only(&self.file)?
        };
        Ok(Part { map })
    }

    /// Removes the file's name (mappings stay valid).
    pub fn unlink(&self) -> Result<(), MapError> {
        std::fs::remove_file(&self.path).map_err(MapError::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("radixd-mapfile-{}-{name}", std::process::id()))
    }

    #[test]
    fn create_map_in_parts_and_reopen() {
        let path = tmp("parts");
        drop(std::fs::remove_file(&path));
        let f = MappedFile::create(&path, 3 * MAP_ALIGN, 0o600).unwrap();
        assert_eq!(
            MappedFile::create(&path, MAP_ALIGN, 0o600).unwrap_err(),
            MapError::Exists
        );
        let whole = f.map(0, 3 * MAP_ALIGN, true).unwrap();
        // SAFETY: inside the mapping, written by this thread only.
        unsafe { whole.base().as_ptr().add(MAP_ALIGN as usize).write(7) };
        let again = MappedFile::open(&path).unwrap();
        assert_eq!(again.len(), 3 * MAP_ALIGN);
        let head = again.map(MAP_ALIGN, MAP_ALIGN, false).unwrap();
        // SAFETY: inside the mapping.
        assert_eq!(unsafe { head.base().as_ptr().read() }, 7);
        assert!(again.map(MAP_ALIGN, 3 * MAP_ALIGN, false).is_err());
        assert!(again.map(1, MAP_ALIGN, false).is_err());
        f.unlink().unwrap();
        assert_eq!(MappedFile::open(&path).unwrap_err(), MapError::NotFound);
    }

    #[test]
    fn more_than_the_free_room_is_refused_before_any_allocation() {
        let path = tmp("huge");
        drop(std::fs::remove_file(&path));
        // More than any file system here holds: refused by the free-room
        // check, so nothing is allocated (on tmpfs, fallocate would take
        // RAM page by page first).
        let err = MappedFile::create(&path, 1 << 62, 0o600).unwrap_err();
        assert!(
            matches!(err, MapError::NoSpace { needed, free: Some(free) } if needed == 1 << 62 && free < needed),
            "{err:?}"
        );
        assert_eq!(MappedFile::open(&path).unwrap_err(), MapError::NotFound);
    }
}
