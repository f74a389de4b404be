//! Store file adoption (`radixd::store::StoreFile::open_in`, which checks
//! the header and then `StoreIndex::adopt`s the index): a daemon adopts a
//! file a dead daemon left, and anything may have written it. A store
//! file with bytes patched anywhere in its index is refused with a typed
//! `OpenStoreError`, or adopted into a store whose `validate()` holds, whose
//! readers stay in bounds, that stores and returns new values, and that can
//! evict every value it holds. A client mapping the same file
//! (`StoreMap`) and reading it with a `StoreReader` never leaves it either.
//!
//! Input: one control byte, then patches: a 4-byte offset into the file's
//! records (header, namespaces, buckets, entries, clock, counters, stamps),
//! a length byte, that many bytes. The data region is not patched: its
//! bytes are values, which nothing interprets.

#![no_main]

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use radixd::store::{
    OpenStoreError, StoreConfig, StoreFile, StoreIndex, StoreLayout, StoreMap, StoreNs, StoreReader,
};

/// A store file, made once per process by a real `StoreFile`.
struct Seed {
    dir: PathBuf,
    config: StoreConfig,
    layout: StoreLayout,
    /// The file's records (everything before the data region).
    records: Vec<u8>,
    /// What was stored: namespace name, value size, keys.
    stored: Vec<Stored>,
    /// The file each run patches and adopts.
    target: File,
}

/// A namespace of the seed: its name, value size and keys.
type Stored = (&'static [u8], u64, Vec<Vec<u8>>);

const NAME: &str = "t";

/// Removes the seed's directory when the process exits normally
/// (`-runs=N`, `-max_total_time`); `scripts/fuzz` removes what a crash
/// leaves.
extern "C" fn remove_dir() {
    if let Some(seed) = SEED.get() {
        let _ = std::fs::remove_dir_all(&seed.dir);
    }
}

static SEED: OnceLock<Seed> = OnceLock::new();

fn seed() -> &'static Seed {
    SEED.get_or_init(|| {
        let dir = PathBuf::from(format!("/dev/shm/radixd-fuzz-store-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory in /dev/shm");
        // SAFETY: `remove_dir` is an `extern "C" fn()` that does not unwind
        // out (its errors are ignored).
        unsafe { libc::atexit(remove_dir) };
        let config = StoreConfig::for_size(1 << 20, 2).expect("a valid store size");
        let layout = StoreLayout::new(config).expect("a valid layout");
        let mut stored = Vec::new();
        {
            let mut file =
                StoreFile::open_in(&dir, "seed", config, 0o600, true).expect("a new store file");
            let index = &mut file.index;
            for (name, size, n) in [(&b"kv"[..], 64u64, 12u32), (&b"pages"[..], 4096, 5)] {
                let ns = index.namespace(name, size).expect("a namespace");
                let keys: Vec<Vec<u8>> = (0..n)
                    .map(|i| [name, format!("-{i}").as_bytes()].concat())
                    .collect();
                put(index, ns, &keys, 0);
                stored.push((name, size, keys));
            }
            // A reservation cut short: adoption drops it.
            let ns = index.namespace(b"kv", 64).expect("the namespace again");
            index
                .reserve(1, ns.id, &[b"half".as_slice()], &[])
                .expect("a reservation");
            index.validate().expect("a valid seed");
        }
        let seed_path = dir.join("seed.store");
        let bytes = std::fs::read(&seed_path).expect("the seed file");
        assert_eq!(bytes.len() as u64, layout.file_bytes);
        let _ = std::fs::remove_file(&seed_path);
        let data_at = layout.data_at as usize;
        let target = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.join(format!("{NAME}.store")))
            .expect("the target file");
        target.set_len(layout.file_bytes).expect("sized");
        Seed {
            dir,
            config,
            layout,
            records: bytes[..data_at].to_vec(),
            stored,
            target,
        }
    })
}

/// Stores `keys` in `ns` (each the parent of the next), each value its
/// key's bytes and `salt` repeated; returns the value of each key stored
/// now (`None`: it was there, or the store refused).
fn put(index: &mut StoreIndex, ns: StoreNs, keys: &[Vec<u8>], salt: u8) -> Vec<Option<Vec<u8>>> {
    let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    let parents: Vec<Option<&[u8]>> = std::iter::once(None)
        .chain(refs.iter().map(|k| Some(*k)))
        .take(refs.len())
        .collect();
    let values: Vec<Vec<u8>> = keys
        .iter()
        .map(|k| {
            k.iter()
                .chain(std::iter::once(&salt))
                .copied()
                .cycle()
                .take(ns.value_size as usize)
                .collect()
        })
        .collect();
    let Ok(slots) = index.reserve(0, ns.id, &refs, &parents) else {
        return Vec::new();
    };
    let mut taken = Vec::new();
    let mut stored = Vec::new();
    for (slot, value) in slots.iter().zip(values) {
        stored.push(slot.map(|_| value.clone()));
        let Some(slot) = slot else { continue };
        // SAFETY: the slot is reserved for this owner (nothing else
        // writes it); `copy_in` checks it lies inside the data region;
        // the value is a live buffer of its length.
        assert!(unsafe {
            index
                .view()
                .copy_in(slot.offset, value.as_ptr(), value.len())
        });
        taken.push(*slot);
    }
    index
        .commit(0, ns.id, &taken)
        .expect("a commit of what was reserved");
    stored
}

/// Reads `key` of `ns` with a reader; the value if it was there.
fn get(reader: &StoreReader, ns: StoreNs, key: &[u8]) -> Option<Vec<u8>> {
    // A garbled file's namespace may claim any size (a client sizes its
    // buffers from its own configuration, and the reader checks them
    // against the namespace): sizes past the file's own still probe the
    // reader's bounds checks, and stay allocatable.
    let size = usize::try_from(ns.value_size)
        .ok()
        .filter(|&s| s <= 1 << 26)?;
    let mut out = vec![0u8; size];
    // SAFETY: `out` is a live, private buffer of the value's size.
    let hit = unsafe { reader.get_raw(ns, key, &[(out.as_mut_ptr(), out.len())], 1) };
    hit.then_some(out)
}

fuzz_target!(|data: &[u8]| {
    let seed = seed();
    let Some((&control, mut patches)) = data.split_first() else {
        return;
    };
    // The records a client or the file system could garble: the header
    // through the stamps (what lies between them and the data region is
    // never read).
    let span = (seed.layout.stamps_at + u64::from(seed.config.entries) * 8) as usize;
    let mut records = seed.records[..span].to_vec();
    while patches.len() >= 5 {
        let at = u32::from_le_bytes(patches[..4].try_into().expect("4 bytes")) as usize;
        let len = usize::from(patches[4]);
        let bytes = &patches[5..(5 + len).min(patches.len())];
        patches = &patches[5 + bytes.len()..];
        // Most patches land in the header, namespaces and the first
        // entries, where the seed's values are.
        let at = if control & 1 != 0 {
            at % span
        } else {
            at % (seed.layout.entries_at as usize + 64 * 320)
        };
        let end = (at + bytes.len()).min(span);
        records[at..end].copy_from_slice(&bytes[..end - at]);
    }
    // The data region is left as the last run left it: values are bytes
    // nothing interprets, and each run checks only the values it stores.
    seed.target
        .write_all_at(&records, 0)
        .expect("records written");

    // A client maps the file as it is and reads it.
    if control & 2 != 0 {
        if let Ok(map) = StoreMap::open_in(&seed.dir, NAME) {
            let reader = StoreReader::new(map.view(), 1);
            for (name, _, keys) in &seed.stored {
                if let Some(ns) = reader.namespace(name) {
                    for key in keys {
                        let _ = get(&reader, ns, key);
                    }
                    let _ = reader.run(ns, keys);
                }
            }
            let _ = reader.stats();
        }
    }

    let mut file = match StoreFile::open_in(&seed.dir, NAME, seed.config, 0o600, false) {
        Ok(file) => file,
        Err(e @ (OpenStoreError::Adopt { .. } | OpenStoreError::Map { .. })) => {
            assert!(!e.to_string().is_empty());
            return;
        }
        Err(e) => panic!("a valid configuration refused: {e}"),
    };
    assert!(file.adopted);
    let index = &mut file.index;
    if let Err(e) = index.validate() {
        panic!("adopted a store that does not validate: {e}");
    }
    let reader = StoreReader::new(*index.view(), 0);
    for (name, _, keys) in &seed.stored {
        if let Some(ns) = reader.namespace(name) {
            for key in keys {
                let _ = get(&reader, ns, key);
            }
        }
    }
    // New values go in and come back.
    let fresh: Vec<Vec<u8>> = (0..3).map(|i| format!("fresh-{i}").into_bytes()).collect();
    for (name, size) in [(&b"kv"[..], 64u64), (&b"new"[..], 128)] {
        let Ok(ns) = index.namespace(name, size) else {
            continue;
        };
        let values = put(index, ns, &fresh, control);
        if let Err(e) = index.validate() {
            panic!("invalid after a put into the adopted store: {e}");
        }
        for (key, value) in fresh.iter().zip(&values) {
            if let Some(value) = value {
                assert_eq!(
                    get(&reader, ns, key).as_ref(),
                    Some(value),
                    "a value came back changed"
                );
            }
        }
    }
    // Every value can be evicted: nothing adopted is stuck (a parent
    // cycle, a count gone wrong).
    let entries = seed.config.entries;
    let mut evicted = 0;
    while index.evict_one() {
        evicted += 1;
        assert!(evicted <= entries, "evicted more values than entries");
    }
    index.reclaim();
    if let Err(e) = index.validate() {
        panic!("invalid after evicting everything: {e}");
    }
    assert_eq!(
        index.figures().values,
        0,
        "values left that cannot be evicted"
    );
});
