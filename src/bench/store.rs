//! `radixd bench --store`: the node-wide KV store's data path against the
//! limit, a plain copy of the same bytes.
//!
//! - batches of [`BATCH`] pages of 64 KiB, 256 KiB and 2 MiB: `store_put`
//!   (reserve, copy into the shared slots, commit) and `store_get_many`
//!   (a lock-free copy out), each against `copy_from_slice` of the same
//!   pages between two private buffers;
//! - 1, 2, 4, 8 reader processes getting batches at once: aggregate GB/s.
//!
//! A daemon with `--store` is started in this process (the readers are
//! processes of this binary, `bench-store-reader`).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use radixd_ipc::sync::{AtomicU32, Ordering};

use super::BenchError;
use crate::daemon::{serve, ServeConfig};
use crate::store::{StoreItem, StoreNs};
use crate::Client;

/// Pages per batch (SGLang's HiCache moves pages in batches like this).
pub const BATCH: usize = 128;
/// Page sizes measured.
pub const PAGE_SIZES: [usize; 3] = [64 << 10, 256 << 10, 2 << 20];
/// Reader process counts measured.
pub const READERS: [u32; 4] = [1, 2, 4, 8];
/// Bytes of the bench daemon's store.
const STORE_BYTES: u64 = 1 << 30;
/// Page size the concurrent readers get.
const READER_PAGE: usize = 256 << 10;

/// Flags of the hidden `bench-store-reader` subcommand.
#[derive(clap::Args, Debug, Clone)]
pub struct StoreReaderArgs {
    /// Daemon name.
    #[arg(long)]
    pub name: String,
    /// Namespace and page size to read.
    #[arg(long)]
    pub ns: String,
    #[arg(long)]
    pub page: usize,
    /// Keys stored (`key(0..keys)`).
    #[arg(long)]
    pub keys: usize,
    /// How long to read, in milliseconds.
    #[arg(long)]
    pub millis: u64,
}

/// A zeroed buffer aligned to 4 KiB, as a server's host KV pool pages are
/// (so copies into it take the same path they take there).
struct Page {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

impl Page {
    fn new(len: usize, fill: u8) -> Self {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 4096)
            .unwrap_or_else(|_| std::alloc::Layout::new::<u8>());
        // SAFETY: a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = std::ptr::NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout);
        };
        let mut page = Self { ptr, layout };
        page.as_mut().fill(fill);
        page
    }

    fn as_ref(&self) -> &[u8] {
        // SAFETY: `layout.size()` initialised bytes owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }

    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

fn key(i: usize) -> Vec<u8> {
    format!("{i:064x}").into_bytes()
}

fn failed(e: impl std::fmt::Display) -> BenchError {
    BenchError::Worker(e.to_string())
}

/// Median of `xs` (not empty).
fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Runs `radixd bench --store` with `rounds` timed batches per figure.
pub fn run(rounds: u32, exe: &Path, out: &mut impl Write) -> Result<(), BenchError> {
    let name = format!("radixd-bench-store-{}", std::process::id());
    let stop = AtomicU32::new(0);
    let config = ServeConfig {
        name: name.clone(),
        page_size: 16,
        capacity: 1024,
        max_clients: 12,
        scratch_bytes: 1 << 20,
        store: Some(STORE_BYTES),
        store_reset: true,
        ..ServeConfig::default()
    };
    let result = std::thread::scope(|scope| {
        let daemon = scope.spawn(|| serve(&config, &stop));
        let result = Client::connect_waiting(&name, Duration::from_secs(10))
            .map_err(|e| BenchError::Server(format!("the daemon did not start: {e}")))
            .and_then(|mut c| measure(&mut c, &name, rounds.max(1), exe, out));
        // Relaxed: a lone stop flag polled by the daemon loop.
        stop.store(1, Ordering::Relaxed);
        match daemon.join() {
            Ok(Ok(())) => result,
            Ok(Err(e)) => Err(BenchError::Server(e.to_string())),
            Err(_) => Err(BenchError::Server("the daemon thread panicked".into())),
        }
    });
    drop(std::fs::remove_file(crate::store::file::store_path(&name)));
    result
}

fn measure(
    c: &mut Client,
    name: &str,
    rounds: u32,
    exe: &Path,
    out: &mut impl Write,
) -> Result<(), BenchError> {
    writeln!(
        out,
        "store {} MiB (warmed), batches of {BATCH} pages (4 KiB aligned buffers), median of {rounds} batches; copy = copy_from_slice of the same pages",
        STORE_BYTES >> 20
    )?;
    writeln!(
        out,
        "{:>8}  {:>10}  {:>10}  {:>10}  {:>9}  {:>9}",
        "page", "copy GB/s", "get GB/s", "set GB/s", "get/copy", "set/copy"
    )?;
    // Warm-up: one pass of writes over the whole store, so every page of
    // it is mapped in this process (a long-running server's state; the
    // first touch of a tmpfs page costs a fault, see docs/store.md).
    let warm = c
        .store_namespace("bench-warm", READER_PAGE as u64)
        .map_err(failed)?;
    let filler = vec![1u8; READER_PAGE];
    let mut next = 0usize;
    for _ in 0..(STORE_BYTES as usize / READER_PAGE).div_ceil(BATCH) {
        let ks: Vec<Vec<u8>> = (next..next + BATCH).map(key).collect();
        next += BATCH;
        let items: Vec<StoreItem<'_>> = ks
            .iter()
            .map(|k| StoreItem {
                key: k,
                parent: None,
                value: &filler,
            })
            .collect();
        c.store_put(warm, &items).map_err(failed)?;
    }
    for &page in &PAGE_SIZES {
        let ns = c
            .store_namespace(&format!("bench-{page}"), page as u64)
            .map_err(failed)?;
        let src: Vec<Page> = (0..BATCH)
            .map(|i| Page::new(page, (i % 251) as u8))
            .collect();
        let mut dst: Vec<Page> = (0..BATCH).map(|_| Page::new(page, 0)).collect();
        let bytes = (BATCH * page) as f64;
        let (mut copy, mut get, mut set) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..=rounds {
            let t = Instant::now();
            for (d, s) in dst.iter_mut().zip(&src) {
                d.as_mut().copy_from_slice(s.as_ref());
            }
            let copy_s = t.elapsed().as_secs_f64();
            let keys: Vec<Vec<u8>> = (next..next + BATCH).map(key).collect();
            next += BATCH;
            let items: Vec<StoreItem<'_>> = keys
                .iter()
                .zip(&src)
                .enumerate()
                .map(|(i, (k, v))| StoreItem {
                    key: k,
                    parent: i.checked_sub(1).map(|p| keys[p].as_slice()),
                    value: v.as_ref(),
                })
                .collect();
            let t = Instant::now();
            let stored = c.store_put(ns, &items).map_err(failed)?;
            let set_s = t.elapsed().as_secs_f64();
            let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
            let mut outs: Vec<&mut [u8]> = dst.iter_mut().map(Page::as_mut).collect();
            let t = Instant::now();
            let hits = c.store_get_many(ns, &refs, &mut outs).map_err(failed)?;
            let get_s = t.elapsed().as_secs_f64();
            if stored.iter().any(|&s| !s) || hits.iter().any(|&h| !h) {
                return Err(failed("a fresh batch was not stored and read whole"));
            }
            if dst.iter().zip(&src).any(|(d, s)| d.as_ref() != s.as_ref()) {
                return Err(failed("a get returned other bytes"));
            }
            // Round 0 warms the mappings and the buffers.
            if round > 0 {
                copy.push(bytes / copy_s / 1e9);
                set.push(bytes / set_s / 1e9);
                get.push(bytes / get_s / 1e9);
            }
        }
        let (copy, get, set) = (median(copy), median(get), median(set));
        writeln!(
            out,
            "{:>8}  {copy:>10.2}  {get:>10.2}  {set:>10.2}  {:>8.2}x  {:>8.2}x",
            format!("{} KiB", page >> 10),
            get / copy,
            set / copy
        )?;
    }
    // Concurrent readers: pages of 256 KiB, as many as half the store.
    let keys = (STORE_BYTES as usize / 2) / READER_PAGE;
    let ns_name = "bench-readers";
    let ns: StoreNs = c
        .store_namespace(ns_name, READER_PAGE as u64)
        .map_err(failed)?;
    let value = vec![7u8; READER_PAGE];
    for chunk in (0..keys).collect::<Vec<_>>().chunks(BATCH) {
        let ks: Vec<Vec<u8>> = chunk.iter().map(|&i| key(i)).collect();
        let items: Vec<StoreItem<'_>> = ks
            .iter()
            .map(|k| StoreItem {
                key: k,
                parent: None,
                value: &value,
            })
            .collect();
        c.store_put(ns, &items).map_err(failed)?;
    }
    writeln!(
        out,
        "\nreaders (processes) getting batches of {BATCH} pages of {} KiB at once, 1 s each:",
        READER_PAGE >> 10
    )?;
    writeln!(
        out,
        "{:>8}  {:>14}  {:>10}",
        "readers", "aggregate GB/s", "vs 1"
    )?;
    let mut one = None;
    for &n in &READERS {
        let children = (0..n)
            .map(|_| {
                Command::new(exe)
                    .args(["bench-store-reader", "--name", name, "--ns", ns_name])
                    .args(["--page", &READER_PAGE.to_string()])
                    .args(["--keys", &keys.to_string(), "--millis", "1000"])
                    .stdout(Stdio::piped())
                    .spawn()
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut total = 0.0;
        for child in children {
            let done = child.wait_with_output()?;
            let text = String::from_utf8_lossy(&done.stdout);
            let gbps: f64 = text
                .trim()
                .parse()
                .map_err(|_| failed(format!("a reader said {text:?}")))?;
            total += gbps;
        }
        let base = *one.get_or_insert(total);
        writeln!(out, "{n:>8}  {total:>14.2}  {:>9.2}x", total / base)?;
    }
    Ok(())
}

/// One reader process: gets batches of random stored keys until its time
/// is up; prints its GB/s.
pub fn reader(args: &StoreReaderArgs) -> Result<(), BenchError> {
    let c = Client::connect(&args.name).map_err(failed)?;
    let ns = c
        .store_find_namespace(&args.ns)
        .map_err(failed)?
        .ok_or_else(|| failed("no such namespace"))?;
    let mut bufs: Vec<Page> = (0..BATCH).map(|_| Page::new(args.page, 0)).collect();
    let keys: Vec<Vec<u8>> = (0..args.keys.max(1)).map(key).collect();
    let mut x = u64::from(std::process::id()) | 1;
    let (start, mut bytes) = (Instant::now(), 0u64);
    let until = Duration::from_millis(args.millis);
    while start.elapsed() < until {
        let batch: Vec<&[u8]> = (0..BATCH)
            .map(|_| {
                // xorshift: a cheap spread over the stored keys.
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                keys[(x % keys.len() as u64) as usize].as_slice()
            })
            .collect();
        let mut outs: Vec<&mut [u8]> = bufs.iter_mut().map(Page::as_mut).collect();
        let hits = c.store_get_many(ns, &batch, &mut outs).map_err(failed)?;
        bytes += hits.iter().filter(|&&h| h).count() as u64 * args.page as u64;
    }
    println!("{}", bytes as f64 / start.elapsed().as_secs_f64() / 1e9);
    Ok(())
}
