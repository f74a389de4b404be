//! SIGINT and SIGTERM as a flag the daemon's loop polls.

use radixd_ipc::sync::{AtomicU32, Ordering};

/// Non-zero once SIGINT or SIGTERM arrived.
pub static STOP: AtomicU32 = AtomicU32::new(0);

extern "C" fn on_signal(_: libc::c_int) {
    // Relaxed: a lone flag; an atomic store is async-signal-safe.
    STOP.store(1, Ordering::Relaxed);
}

/// Routes SIGINT and SIGTERM to [`STOP`].
pub fn install() -> std::io::Result<()> {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: `on_signal` only performs an atomic store, which is
        // async-signal-safe; the sigaction struct is fully initialised
        // (zeroed, then the handler and an empty mask set).
        let rc = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
