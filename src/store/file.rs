//! Where a store lives: [`StoreFile`], the daemon's `/dev/shm/<name>.store`
//! (created, or adopted from a previous daemon); [`StoreMap`], a client's
//! two mappings of it (the index read-only, the rest read-write); and
//! [`HeapStore`], a store in private memory (`radixd exec --store`,
//! `radixd replay --policy store`, tests).

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::fmt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use radixd_ipc::segment::SHM_DIR;
use radixd_ipc::sync::Ordering;
use radixd_ipc::{MapError, MappedFile, Part};

use super::error::AdoptError;
use super::index::StoreIndex;
use super::layout::{ConfigError, StoreConfig, StoreLayout, LAYOUT_VERSION, MAGIC, PAGE};
use super::reader::StoreReader;
use super::view::StoreView;

/// The store file of the daemon named `name`, in `dir`.
pub fn store_path_in(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.store"))
}

/// The store file of the daemon named `name` in `/dev/shm`.
pub fn store_path(name: &str) -> PathBuf {
    store_path_in(Path::new(SHM_DIR), name)
}

/// Why a store could not be opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenStoreError {
    Config(ConfigError),
    Map {
        path: PathBuf,
        error: MapError,
    },
    /// The daemon will not trust what the file holds.
    Adopt {
        path: PathBuf,
        error: AdoptError,
    },
}

impl fmt::Display for OpenStoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Config(e) => write!(f, "bad store size: {e}"),
            Self::Map { path, error } => write!(f, "store file {}: {error}", path.display()),
            Self::Adopt { path, error } => write!(
                f,
                "refusing the store file {}: {error} (start with --store-reset to discard it and start empty)",
                path.display()
            ),
        }
    }
}

impl std::error::Error for OpenStoreError {}

/// The daemon's store: the file, mapped whole, and its index.
pub struct StoreFile {
    pub index: StoreIndex,
    /// Whether it was adopted (else created empty).
    pub adopted: bool,
    // Dropped after `index`, whose view points into it.
    _map: Part,
    file: MappedFile,
}

impl fmt::Debug for StoreFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreFile")
            .field("path", &self.file.path())
            .field("adopted", &self.adopted)
            .finish()
    }
}

impl StoreFile {
    /// Opens the store of daemon `name` in `dir`, sized `config`: adopts
    /// the file a previous daemon left (refused if it cannot be trusted or
    /// was made with another size), or creates it (mode `mode`) when there
    /// is none or `reset` says to discard it.
    pub fn open_in(
        dir: &Path,
        name: &str,
        config: StoreConfig,
        mode: u32,
        reset: bool,
    ) -> Result<Self, OpenStoreError> {
        let layout = StoreLayout::new(config).map_err(OpenStoreError::Config)?;
        let path = store_path_in(dir, name);
        let map_err = |error| OpenStoreError::Map {
            path: path.clone(),
            error,
        };
        if reset {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(map_err(e.into())),
            }
        }
        match MappedFile::open(&path) {
            Ok(file) => {
                let adopt_err = |error| OpenStoreError::Adopt {
                    path: path.clone(),
                    error,
                };
                let asked = config.data_bytes;
                let found = file_config(&file).map_err(adopt_err)?;
                if found.data_bytes != asked
                    || found.extent_bytes != config.extent_bytes
                    || found.entries != config.entries
                {
                    return Err(adopt_err(AdoptError::Size {
                        file: found.data_bytes,
                        asked,
                    }));
                }
                if found.clients != config.clients || file.len() != layout.file_bytes {
                    return Err(adopt_err(AdoptError::Header(format!(
                        "made for {} clients and {} bytes, not {} and {}",
                        found.clients,
                        file.len(),
                        config.clients,
                        layout.file_bytes
                    ))));
                }
                let map = file.map(0, layout.file_bytes, true).map_err(map_err)?;
                map.advise_huge();
                // SAFETY: the mapping holds the whole file, page aligned,
                // and lives in `self` beside the index that uses the view
                // (dropped after it).
                let view = unsafe { whole_view(&map, layout) };
                let index = StoreIndex::adopt(view).map_err(adopt_err)?;
                Ok(Self {
                    index,
                    adopted: true,
                    _map: map,
                    file,
                })
            }
            Err(MapError::NotFound) => {
                let file = MappedFile::create(&path, layout.file_bytes, mode).map_err(map_err)?;
                let map = file.map(0, layout.file_bytes, true).map_err(map_err)?;
                map.advise_huge();
                // SAFETY: as above.
                let view = unsafe { whole_view(&map, layout) };
                Ok(Self {
                    index: StoreIndex::format(view),
                    adopted: false,
                    _map: map,
                    file,
                })
            }
            Err(error) => Err(map_err(error)),
        }
    }

    /// [`StoreFile::open_in`] in `/dev/shm`.
    pub fn open(
        name: &str,
        config: StoreConfig,
        mode: u32,
        reset: bool,
    ) -> Result<Self, OpenStoreError> {
        Self::open_in(Path::new(SHM_DIR), name, config, mode, reset)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        self.file.path()
    }
}

/// A view of a whole mapping of a store laid out as `layout`.
///
/// # Safety
///
/// `map` must hold `layout.file_bytes` bytes and outlive the view.
unsafe fn whole_view(map: &Part, layout: StoreLayout) -> StoreView {
    let base = map.base();
    // SAFETY: `ro_bytes < file_bytes`, inside the mapping.
    let rw = unsafe { NonNull::new_unchecked(base.as_ptr().add(layout.ro_bytes as usize)) };
    // SAFETY: forwarded from the caller; page aligned.
    unsafe { StoreView::new(base, rw, layout) }
}

/// The configuration a store file's header names, checked against its
/// magic, version, layout hash and length.
fn file_config(file: &MappedFile) -> Result<StoreConfig, AdoptError> {
    if file.len() < PAGE {
        return Err(AdoptError::Magic);
    }
    let head = file
        .map(0, PAGE, false)
        .map_err(|e| AdoptError::Header(e.to_string()))?;
    // SAFETY: the page is mapped and 4 KiB long; the header (512 bytes,
    // atomics only) lies at its start.
    let h = unsafe { &*head.base().as_ptr().cast::<super::layout::Header>() };
    // Relaxed, all: written before the store was published (a daemon) or
    // long before (a dead one).
    if h.magic.load(Ordering::Relaxed) != MAGIC {
        return Err(AdoptError::Magic);
    }
    let version = h.version.load(Ordering::Relaxed);
    if version != LAYOUT_VERSION {
        return Err(AdoptError::Version { found: version });
    }
    let bad = |what: &str| AdoptError::Header(format!("{what} out of range"));
    let config = StoreConfig {
        data_bytes: h.data_bytes.load(Ordering::Relaxed),
        extent_bytes: h.extent_bytes.load(Ordering::Relaxed),
        entries: u32::try_from(h.entries.load(Ordering::Relaxed)).map_err(|_| bad("entries"))?,
        clients: u32::try_from(h.clients.load(Ordering::Relaxed)).map_err(|_| bad("clients"))?,
    };
    let layout = StoreLayout::new(config).map_err(AdoptError::Config)?;
    if h.hash.load(Ordering::Relaxed) != layout.hash
        || h.file_bytes.load(Ordering::Relaxed) != layout.file_bytes
        || file.len() != layout.file_bytes
    {
        return Err(AdoptError::Header(
            "its layout hash or length contradicts its configuration".into(),
        ));
    }
    Ok(config)
}

/// A client's mappings of a daemon's store: the index read-only, the
/// clock, counters, stamps and data read-write.
#[derive(Debug)]
pub struct StoreMap {
    view: StoreView,
    _ro: Part,
    _rw: Part,
    _file: MappedFile,
}

impl StoreMap {
    /// Maps the store of daemon `name` in `dir` (the daemon has published
    /// it: the caller saw its segment serving with a store).
    pub fn open_in(dir: &Path, name: &str) -> Result<Self, OpenStoreError> {
        let path = store_path_in(dir, name);
        let map_err = |error| OpenStoreError::Map {
            path: path.clone(),
            error,
        };
        let file = MappedFile::open(&path).map_err(map_err)?;
        let config = file_config(&file).map_err(|error| OpenStoreError::Adopt {
            path: path.clone(),
            error,
        })?;
        let layout = StoreLayout::new(config).map_err(OpenStoreError::Config)?;
        let ro = file.map(0, layout.ro_bytes, false).map_err(map_err)?;
        let rw = file
            .map(layout.ro_bytes, layout.rw_bytes(), true)
            .map_err(map_err)?;
        rw.advise_huge();
        // SAFETY: both parts are mapped at their full lengths, page
        // aligned, and live in `self` beside the view.
        let view = unsafe { StoreView::new(ro.base(), rw.base(), layout) };
        Ok(Self {
            view,
            _ro: ro,
            _rw: rw,
            _file: file,
        })
    }

    /// [`StoreMap::open_in`] in `/dev/shm`.
    pub fn open(name: &str) -> Result<Self, OpenStoreError> {
        Self::open_in(Path::new(SHM_DIR), name)
    }

    /// The view (valid while `self` lives).
    pub fn view(&self) -> StoreView {
        self.view
    }
}

/// A store in this process's memory: an index and a reader over one
/// allocation (no grace period: nothing reads beside the writer).
pub struct HeapStore {
    pub index: StoreIndex,
    pub reader: StoreReader,
    base: NonNull<u8>,
    alloc: Layout,
}

impl HeapStore {
    /// A store configured so, zeroed and formatted.
    pub fn new(config: StoreConfig) -> Result<Self, ConfigError> {
        let layout = StoreLayout::new(config)?;
        let size = usize::try_from(layout.file_bytes).map_err(|_| ConfigError::Size(0))?;
        let alloc =
            Layout::from_size_align(size, PAGE as usize).map_err(|_| ConfigError::Size(0))?;
        // SAFETY: the layout has a non-zero size (a header page at least).
        let ptr = unsafe { alloc_zeroed(alloc) };
        let Some(base) = NonNull::new(ptr) else {
            std::alloc::handle_alloc_error(alloc);
        };
        // SAFETY: the allocation holds `file_bytes` bytes, page aligned,
        // and is freed only in `drop`, after the index and reader go.
        let rw = unsafe { NonNull::new_unchecked(base.as_ptr().add(layout.ro_bytes as usize)) };
        // SAFETY: as above.
        let view = unsafe { StoreView::new(base, rw, layout) };
        Ok(Self {
            index: StoreIndex::format(view),
            reader: StoreReader::new(view, 0),
            base,
            alloc,
        })
    }
}

impl HeapStore {
    /// Stores each item not stored yet (`true`: stored now, `false`: it was
    /// there): reserve, copy, commit, as a client does.
    pub fn put(
        &mut self,
        ns: super::StoreNs,
        items: &[super::StoreItem<'_>],
    ) -> Result<Vec<bool>, super::StoreError> {
        if let Some(bad) = items.iter().find(|i| i.value.len() as u64 != ns.value_size) {
            return Err(super::StoreError::SizeMismatch {
                expected: ns.value_size,
                got: bad.value.len() as u64,
            });
        }
        let keys: Vec<&[u8]> = items.iter().map(|i| i.key).collect();
        let parents: Vec<Option<&[u8]>> = items.iter().map(|i| i.parent).collect();
        let slots = self.index.reserve(0, ns.id, &keys, &parents)?;
        let mut taken = Vec::new();
        for (slot, item) in slots.iter().zip(items) {
            let Some(slot) = slot else { continue };
            // SAFETY: the slot is reserved for us (nothing else writes it);
            // `copy_in` checks it lies inside the data region; the value is
            // a live buffer of its length.
            unsafe {
                self.index
                    .view()
                    .copy_in(slot.offset, item.value.as_ptr(), item.value.len())
            };
            taken.push(*slot);
        }
        self.index.commit(0, ns.id, &taken)?;
        Ok(slots.iter().map(Option::is_some).collect())
    }

    /// Copies the value of `key` into `out` (`ns.value_size` bytes);
    /// whether it was stored.
    pub fn get(&self, ns: super::StoreNs, key: &[u8], out: &mut [u8]) -> bool {
        if out.len() as u64 != ns.value_size {
            return false;
        }
        let stamp = self.reader.stamps(1);
        // SAFETY: `out` is a live, exclusive buffer of the value's size.
        let hit = unsafe {
            self.reader
                .get_raw(ns, key, &[(out.as_mut_ptr(), out.len())], stamp)
        };
        self.reader.count(u64::from(hit), u64::from(!hit));
        hit
    }
}

impl Drop for HeapStore {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; the index and reader
        // point into it but are not used after this (they are plain data
        // without drop glue that touches the memory).
        unsafe { dealloc(self.base.as_ptr(), self.alloc) };
    }
}

// SAFETY: the allocation is owned; used by one thread at a time.
unsafe impl Send for HeapStore {}
