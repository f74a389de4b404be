//! The physical limits a radixd round trip is measured against, in the same
//! run: two processes ping-ponging one cache line (the cheapest possible
//! cross-process round trip), and the same ping-pong with a 4 KiB copy by
//! the other side (what moving a 1K-token prompt across cores costs at
//! least).
//!
//! The two sides are the bench process and a `fork`ed child sharing an
//! anonymous `MAP_SHARED` mapping, each pinned to its own core when the
//! host has two: nothing but atomics and plain copies runs between the
//! samples, so the figures are the hardware's, not radixd's.

use std::time::{Duration, Instant};

use radixd_ipc::copy;
use radixd_ipc::sync::{spin_loop, yield_now, AtomicU64, Ordering, UnsafeCell};
use serde::{Deserialize, Serialize};

use super::BenchError;

/// Bytes the copy baseline moves each round trip.
pub const COPY_BYTES: usize = 4096;
/// Round trips per timed sample (one `Instant` pair per sample).
const PER_SAMPLE: u32 = 64;
/// Samples per baseline.
const SAMPLES: usize = 400;
/// The child gives up when the parent goes quiet for this long.
const QUIET: Duration = Duration::from_secs(5);

/// The baselines, in microseconds per round trip.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct Baseline {
    /// One cache line, two processes: p50 and p99 of the round trip.
    pub pingpong_p50_us: f64,
    pub pingpong_p99_us: f64,
    /// The same, with the other side copying 4 KiB just written by this
    /// one out of shared memory each round trip.
    pub copy4k_p50_us: f64,
    pub copy4k_p99_us: f64,
}

/// The shared page: the ping-pong word on its own line, then the buffer.
#[repr(C, align(64))]
struct Shared {
    /// Odd: the parent's ping `n`; even: the child's answer. `u64::MAX`
    /// tells the child to stop.
    turn: AtomicU64,
    _pad: [u64; 7],
    /// Written by the parent, read by the child, in turns.
    data: UnsafeCell<[u8; COPY_BYTES]>,
}

const _: () = assert!(size_of::<Shared>() == 64 + COPY_BYTES);
const _: () = assert!(core::mem::offset_of!(Shared, data) == 64);

/// Measures both baselines.
pub fn measure() -> Result<Baseline, BenchError> {
    let (pingpong_p50_us, pingpong_p99_us) = run(false)?;
    let (copy4k_p50_us, copy4k_p99_us) = run(true)?;
    Ok(Baseline {
        pingpong_p50_us,
        pingpong_p99_us,
        copy4k_p50_us,
        copy4k_p99_us,
    })
}

/// A shared anonymous mapping holding one [`Shared`], unmapped on drop.
struct Mapping(std::ptr::NonNull<Shared>);

impl Mapping {
    fn new() -> Result<Self, BenchError> {
        // SAFETY: an anonymous shared mapping of a fresh region; no
        // existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size_of::<Shared>(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(BenchError::Io(std::io::Error::last_os_error()));
        }
        std::ptr::NonNull::new(p.cast::<Shared>())
            .map(Self)
            .ok_or_else(|| BenchError::Server("mmap returned null".into()))
    }

    fn shared(&self) -> &Shared {
        // SAFETY: the mapping is page aligned (so aligned for `Shared`),
        // zero filled (a valid `Shared`: atomics and bytes), and lives as
        // long as `self`.
        unsafe { self.0.as_ref() }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the region `new` mapped; no reference to
        // it outlives `self`.
        unsafe { libc::munmap(self.0.as_ptr().cast(), size_of::<Shared>()) };
    }
}

/// The calling thread's CPU affinity, or `None` if it cannot be read.
fn affinity() -> Option<libc::cpu_set_t> {
    // SAFETY: `cpu_set_t` is a plain bit set for which all zero is valid;
    // sched_getaffinity writes at most its size into it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let rc = libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set);
        (rc == 0).then_some(set)
    }
}

/// The first two cores of `set`, when it has two.
fn two_cores(set: &libc::cpu_set_t) -> Option<(usize, usize)> {
    let mut cores = (0..libc::CPU_SETSIZE as usize)
        // SAFETY: CPU_ISSET reads a bit inside the set (index < CPU_SETSIZE).
        .filter(|&c| unsafe { libc::CPU_ISSET(c, set) });
    Some((cores.next()?, cores.next()?))
}

/// Sets the calling thread's affinity to `set` (best effort: a failure
/// only makes the figures noisier).
fn set_affinity(set: &libc::cpu_set_t) {
    // SAFETY: sched_setaffinity reads a valid, initialised set.
    unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), set) };
}

/// Pins the calling thread to `core` alone.
fn pin(core: usize) {
    // SAFETY: as in `affinity`; CPU_SET writes a bit inside the set (the
    // core came from a set of the same size).
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        set
    };
    set_affinity(&set);
}

/// Waits until `turn` reads `want` (or, on the child's side, `u64::MAX`);
/// false after [`QUIET`]. Spins, yielding now and then on a single core.
fn wait_for(turn: &AtomicU64, want: u64, single_core: bool) -> bool {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        // Acquire: pairs with the peer's Release store of its turn, so the
        // data it wrote before is visible.
        let now = turn.load(Ordering::Acquire);
        if now == want || now == u64::MAX {
            return now == want;
        }
        spins = spins.wrapping_add(1);
        if spins % 4096 == 0 {
            if start.elapsed() > QUIET {
                return false;
            }
            if single_core {
                yield_now();
            }
        }
        spin_loop();
    }
}

/// One baseline: `(p50, p99)` of the round trip in microseconds.
fn run(copy: bool) -> Result<(f64, f64), BenchError> {
    let map = Mapping::new()?;
    let saved = affinity();
    let cores = saved.as_ref().and_then(two_cores);
    let single_core = cores.is_none();
    let rounds = u64::from(PER_SAMPLE) * SAMPLES as u64 + 1;
    // SAFETY: the child only touches the shared mapping, its own stack and
    // a private buffer, and leaves with `_exit` (no destructors, no atexit
    // handlers, no locks that another thread of the parent might have held
    // at the fork: it allocates nothing).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(BenchError::Io(std::io::Error::last_os_error()));
    }
    if pid == 0 {
        if let Some((_, child)) = cores {
            pin(child);
        }
        let shared = map.shared();
        let mut private = [0u8; COPY_BYTES];
        for n in 0..rounds {
            if !wait_for(&shared.turn, 2 * n + 1, single_core) {
                break;
            }
            if copy {
                // The copy radixd's request path uses (2 KiB chunks).
                shared.data.with(|from| {
                    // SAFETY: the parent wrote `data` before its Release
                    // store of the turn we just acquired and does not write
                    // it again before our answer; `private` is ours.
                    unsafe {
                        copy::copy_bytes(from.cast(), private.as_mut_ptr(), COPY_BYTES);
                    }
                });
                std::hint::black_box(&mut private);
            }
            // Release: publishes our answer (and ends our reads of `data`);
            // pairs with the parent's Acquire in `wait_for`.
            shared.turn.store(2 * n + 2, Ordering::Release);
        }
        // SAFETY: leaves the child at once, as argued at the fork.
        unsafe { libc::_exit(0) };
    }
    if let Some((parent, _)) = cores {
        pin(parent);
    }
    let shared = map.shared();
    let mut samples = Vec::with_capacity(SAMPLES);
    let mut n = 0u64;
    let mut failed = false;
    let round = |n: u64| -> bool {
        if copy {
            shared.data.with_mut(|data| {
                // SAFETY: the child reads `data` only between our Release
                // store of its turn and its answer, which we waited for.
                unsafe { data.cast::<u8>().write_bytes(n as u8, COPY_BYTES) }
            });
        }
        // Release: publishes the ping (and the data); pairs with the
        // child's Acquire in `wait_for`.
        shared.turn.store(2 * n + 1, Ordering::Release);
        wait_for(&shared.turn, 2 * n + 2, single_core)
    };
    // One warm-up round trip, then the timed samples.
    if round(n) {
        n += 1;
        'outer: for _ in 0..SAMPLES {
            let t = Instant::now();
            for _ in 0..PER_SAMPLE {
                if !round(n) {
                    failed = true;
                    break 'outer;
                }
                n += 1;
            }
            samples.push(t.elapsed().as_nanos() as f64 / f64::from(PER_SAMPLE) / 1e3);
        }
    } else {
        failed = true;
    }
    // Release: the stop word; nothing to publish, but it pairs like a turn.
    shared.turn.store(u64::MAX, Ordering::Release);
    let mut status = 0;
    // SAFETY: waits for our own child; `status` is a valid out pointer.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    if let Some(saved) = &saved {
        set_affinity(saved);
    }
    if failed || samples.is_empty() {
        return Err(BenchError::Server(
            "the baseline's child process did not answer".into(),
        ));
    }
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    Ok((at(0.5), at(0.99)))
}

/// `value` as a multiple of `base` ("12.3×"), or "-" without a base.
pub fn ratio(value: f64, base: f64) -> String {
    if base > 0.0 && value > 0.0 {
        format!("{:.1}×", value / base)
    } else {
        "-".into()
    }
}
