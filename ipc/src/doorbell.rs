//! Futex doorbell: lets a producer wake a peer sleeping on shared memory.
//!
//! Protocol (the lost wake-up is ruled out by SeqCst, a Dekker pattern):
//!
//! * waiter: `seen = word`; `sleepers += 1`; `fence(SeqCst)`; re-check for
//!   work; `futex_wait(word, seen, timeout)`; `sleepers -= 1`.
//! * ringer: publish work; `fence(SeqCst)`; if `sleepers > 0`:
//!   `word += 1`; `futex_wake(word)`.
//!
//! Either the waiter's fence comes first in the SeqCst order, so the ringer
//! sees `sleepers > 0` and bumps `word` after the waiter read `seen` (the
//! kernel then refuses to sleep on a stale value, or wakes the sleeper); or
//! the ringer's fence comes first, so the waiter's re-check sees the work.
//! The futex is process-shared (no `FUTEX_PRIVATE_FLAG`).
//!
//! Under loom the futex is modelled by a `Mutex` + `Condvar` without
//! timeouts, so a lost wake-up shows up as a deadlock.

#[cfg(not(loom))]
use std::time::Duration;

#[cfg(not(loom))]
use crate::shm::ShmSafe;
use crate::sync::{fence, spin_loop, yield_now, AtomicU32, Ordering};

/// A doorbell in shared memory (or on the heap). All zero is valid.
#[repr(C)]
#[derive(Debug, Default)]
pub struct Doorbell {
    /// Futex word, bumped by every ring that finds a sleeper.
    word: AtomicU32,
    /// Number of waiters that announced they may sleep.
    sleepers: AtomicU32,
    _reserved: [u32; 14],
    #[cfg(loom)]
    model: FutexModel,
}

#[cfg(not(loom))]
const _: () = assert!(size_of::<Doorbell>() == 64);

// SAFETY: two std atomics and padding; every bit pattern is valid.
#[cfg(not(loom))]
unsafe impl ShmSafe for Doorbell {}

/// Loom model of a futex: waiters block on a condvar until the word differs
/// from the value they saw; wake notifies all.
#[cfg(loom)]
#[derive(Debug, Default)]
struct FutexModel {
    lock: crate::sync::Mutex<()>,
    cond: crate::sync::Condvar,
}

/// How a [`Doorbell::wait`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wake {
    /// The readiness check returned true.
    Ready,
    /// Slept (or spun) and nothing arrived within the timeout; the caller
    /// should check its peer's liveness and call again.
    TimedOut,
}

/// Spin policy for [`Doorbell::wait`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spin {
    /// Doubling steps of `spin_loop` hints before yielding (`2^steps` hints
    /// at the last step).
    pub spin_steps: u32,
    /// `yield_now` rounds after spinning, before sleeping.
    pub yield_steps: u32,
}

impl Spin {
    /// Crossbeam `Backoff`-like defaults: 2^0..2^6 spins, then 4 yields.
    pub const DEFAULT: Spin = Spin {
        spin_steps: 7,
        yield_steps: 4,
    };
    /// Never spin: yield at once (more runnable processes than cores).
    pub const YIELD_ONLY: Spin = Spin {
        spin_steps: 0,
        yield_steps: 4,
    };
}

impl Doorbell {
    /// A fresh doorbell.
    pub fn new() -> Self {
        Self::default()
    }

    /// Wakes the peer if it sleeps. Call AFTER publishing the work.
    pub fn ring(&self) {
        // SeqCst fence: orders our publication of work before the `sleepers`
        // load; pairs with the SeqCst fence in `sleep` (Dekker).
        fence(Ordering::SeqCst);
        // SeqCst: part of the total order argued in the module docs.
        if self.sleepers.load(Ordering::SeqCst) == 0 {
            return;
        }
        // SeqCst: the bump is ordered after the waiter's `seen` load (which
        // precedes its `sleepers` increment, read just above).
        self.word.fetch_add(1, Ordering::SeqCst);
        self.futex_wake();
    }

    /// Spins per `spin` until `ready()` holds, then sleeps on the futex once
    /// for at most `timeout`. Never blocks longer than spin + `timeout`.
    #[cfg(not(loom))]
    pub fn wait(&self, mut ready: impl FnMut() -> bool, spin: Spin, timeout: Duration) -> Wake {
        for step in 0..spin.spin_steps {
            if ready() {
                return Wake::Ready;
            }
            for _ in 0..(1u32 << step.min(10)) {
                spin_loop();
            }
        }
        for _ in 0..spin.yield_steps {
            if ready() {
                return Wake::Ready;
            }
            yield_now();
        }
        self.sleep(ready, Some(timeout))
    }

    /// Announces sleep, re-checks `ready()`, then sleeps on the futex until
    /// rung or `timeout` (`None`: no timeout; only the loom model honours
    /// `None` strictly, std callers should always pass a timeout).
    #[cfg(not(loom))]
    pub fn sleep(&self, ready: impl FnMut() -> bool, timeout: Option<Duration>) -> Wake {
        self.sleep_inner(ready, timeout)
    }

    /// Loom version of [`Doorbell::sleep`]: no timeout, so a lost wake-up
    /// deadlocks the model.
    #[cfg(loom)]
    pub fn sleep(&self, ready: impl FnMut() -> bool) -> Wake {
        self.sleep_inner(ready, None::<()>)
    }

    /// Loom model of a sleep whose timeout fires before any wake-up: the
    /// whole protocol runs (announce, re-check, withdraw) without blocking,
    /// so a ringer may see, and act on, a sleeper that is already leaving.
    #[cfg(loom)]
    pub fn sleep_timing_out(&self, ready: impl FnMut() -> bool) -> Wake {
        self.sleep_inner(ready, Some(Expired))
    }

    /// Loom version of [`Doorbell::wait`]: yields a few times, then sleeps.
    #[cfg(loom)]
    pub fn wait(&self, mut ready: impl FnMut() -> bool, spin: Spin) -> Wake {
        for _ in 0..spin.yield_steps.min(1) {
            if ready() {
                return Wake::Ready;
            }
            spin_loop();
            yield_now();
        }
        self.sleep(ready)
    }

    fn sleep_inner<D: Copy>(&self, mut ready: impl FnMut() -> bool, timeout: Option<D>) -> Wake
    where
        Self: FutexWait<D>,
    {
        if ready() {
            return Wake::Ready;
        }
        // SeqCst: must precede the `sleepers` increment in the total order,
        // so a ring that sees our increment bumps the word after this read.
        let seen = self.word.load(Ordering::SeqCst);
        // SeqCst: announces the sleep; read by the SeqCst load in `ring`.
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        // SeqCst fence: orders the announcement before the re-check below;
        // pairs with the SeqCst fence in `ring` (Dekker).
        fence(Ordering::SeqCst);
        let outcome = if ready() {
            Wake::Ready
        } else {
            self.futex_wait(seen, timeout);
            if ready() {
                Wake::Ready
            } else {
                Wake::TimedOut
            }
        };
        // SeqCst: withdraw the announcement (a stale count only costs the
        // ringer a spurious wake syscall).
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        outcome
    }

    /// Raw futex word (for diagnostics and tests).
    pub fn word(&self) -> u32 {
        // Relaxed: diagnostic read.
        self.word.load(Ordering::Relaxed)
    }

    #[cfg(not(loom))]
    fn futex_wake(&self) {
        use rustix::thread::futex;
        // Shared (not PRIVATE) futex: the waiter is another process. An error
        // here (e.g. EFAULT on a torn-down mapping) only costs a wake-up that
        // the waiter's timeout covers.
        let _ = futex::wake(&self.word, futex::Flags::empty(), i32::MAX as u32);
    }

    #[cfg(loom)]
    fn futex_wake(&self) {
        // Taking the lock orders the bump before any waiter's re-check under
        // the lock (models the kernel's atomic compare-and-sleep).
        let guard = self.model.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.model.cond.notify_all();
        drop(guard);
    }
}

/// Blocking primitive behind `sleep`, std futex or loom model.
#[doc(hidden)]
pub trait FutexWait<D> {
    /// Blocks while the word equals `seen`, at most `timeout` where supported.
    fn futex_wait(&self, seen: u32, timeout: Option<D>);
}

#[cfg(not(loom))]
impl FutexWait<Duration> for Doorbell {
    fn futex_wait(&self, seen: u32, timeout: Option<Duration>) {
        use rustix::thread::futex;
        let ts = timeout.map(|d| futex::Timespec {
            tv_sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(d.subsec_nanos()),
        });
        // EAGAIN (word already moved), EINTR and ETIMEDOUT all mean "go and
        // re-check"; the caller does so.
        let _ = futex::wait(&self.word, futex::Flags::empty(), seen, ts.as_ref());
    }
}

#[cfg(loom)]
impl FutexWait<()> for Doorbell {
    fn futex_wait(&self, seen: u32, _timeout: Option<()>) {
        let mut guard = self.model.lock.lock().unwrap_or_else(|p| p.into_inner());
        // SeqCst: same order as the bump in `ring`; the lock makes the check
        // and the wait atomic with respect to `futex_wake`.
        while self.word.load(Ordering::SeqCst) == seen {
            guard = self
                .model
                .cond
                .wait(guard)
                .unwrap_or_else(|p| p.into_inner());
        }
        drop(guard);
    }
}

/// Loom marker: a futex wait whose timeout has already expired.
#[cfg(loom)]
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub struct Expired;

#[cfg(loom)]
impl FutexWait<Expired> for Doorbell {
    fn futex_wait(&self, _seen: u32, _timeout: Option<Expired>) {
        // The timeout fired: back to the caller without blocking.
        yield_now();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    use crate::sync::{Arc, AtomicU64};
    use std::time::Instant;

    #[test]
    fn times_out_without_work() {
        let bell = Doorbell::new();
        let t = Instant::now();
        assert_eq!(
            bell.wait(|| false, Spin::DEFAULT, Duration::from_millis(20)),
            Wake::TimedOut
        );
        assert!(t.elapsed() >= Duration::from_millis(15));
    }

    #[test]
    fn ring_wakes_sleeper() {
        let bell = Arc::new(Doorbell::new());
        let work = Arc::new(AtomicU64::new(0));
        let (b, w) = (bell.clone(), work.clone());
        let waiter = std::thread::spawn(move || {
            let mut got = 0;
            while got < 200 {
                if b.wait(
                    || w.load(Ordering::Acquire) > got,
                    Spin::YIELD_ONLY,
                    Duration::from_secs(5),
                ) == Wake::Ready
                {
                    got = w.load(Ordering::Acquire);
                }
            }
        });
        let start = Instant::now();
        for _ in 0..200 {
            work.fetch_add(1, Ordering::Release);
            bell.ring();
            std::thread::sleep(Duration::from_micros(50));
        }
        waiter.join().unwrap();
        // 200 rounds with a 5 s timeout: a lost wake-up would take seconds.
        assert!(start.elapsed() < Duration::from_secs(4));
    }
}
