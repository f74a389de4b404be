//! Whether to spin or yield while waiting for a peer: scheduling policy on
//! top of the doorbell's mechanism ([`Spin`] is what [`Doorbell::wait`]
//! takes; this module decides which one).
//!
//! [`Doorbell::wait`]: crate::doorbell::Doorbell::wait

use crate::doorbell::Spin;

/// Chooses between [`Spin::DEFAULT`] and [`Spin::YIELD_ONLY`]: when more
/// tasks want to run than there are cores, spinning only steals the CPU
/// from the peer we wait for.
///
/// Two witnesses. The caller's own side (the peers of one service that spin
/// on each other, e.g. a daemon and its clients) is counted exactly, and
/// outnumbering the cores means yielding at once. Everyone else shows up in
/// the host's count of runnable tasks (`/proc/loadavg`), sampled now and
/// then; one sample is a poor witness (with two spinners on two cores a
/// passing kernel or shell task shows up in about one sample in five), so
/// that count makes the sensor yield only when its last
/// [`LoadSensor::WINDOW`] samples all exceeded the cores.
#[derive(Clone, Debug)]
pub struct LoadSensor {
    recent: [usize; LoadSensor::WINDOW],
    next: usize,
    cores: usize,
    peers: usize,
}

impl LoadSensor {
    /// Samples the decision rests on.
    pub const WINDOW: usize = 3;

    /// A sensor primed with one sample.
    pub fn new() -> Self {
        let first = runnable_tasks();
        Self {
            recent: [first; Self::WINDOW],
            next: 0,
            cores: std::thread::available_parallelism().map_or(1, usize::from),
            peers: 0,
        }
    }

    /// Sets how many peers of the caller's own service spin (itself
    /// included); cheap, so call it whenever the number changes.
    pub fn set_peers(&mut self, peers: u64) {
        self.peers = usize::try_from(peers).unwrap_or(usize::MAX);
    }

    /// Takes a sample (a read of `/proc/loadavg`: a few microseconds, so
    /// call it every few milliseconds, not on every wait) and decides.
    pub fn sample(&mut self) -> Spin {
        self.record(runnable_tasks())
    }

    fn record(&mut self, runnable: usize) -> Spin {
        self.recent[self.next] = runnable;
        self.next = (self.next + 1) % Self::WINDOW;
        self.spin()
    }

    /// The decision from the peers and the samples taken so far.
    pub fn spin(&self) -> Spin {
        if self.peers > self.cores || self.recent.iter().all(|&n| n > self.cores) {
            Spin::YIELD_ONLY
        } else {
            Spin::DEFAULT
        }
    }
}

impl Default for LoadSensor {
    fn default() -> Self {
        Self::new()
    }
}

/// Tasks runnable on the host now (the reader included), or 0 when
/// `/proc/loadavg` cannot be read (then the sensor never yields).
fn runnable_tasks() -> usize {
    use std::io::Read;
    // Read into the stack: a client samples this on its request path, which
    // allocates nothing.
    let mut buf = [0u8; 128];
    let Ok(n) = std::fs::File::open("/proc/loadavg").and_then(|mut f| f.read(&mut buf)) else {
        return 0;
    };
    parse_runnable(&buf[..n]).unwrap_or(0)
}

/// The runnable count of `/proc/loadavg` ("0.01 0.02 0.03 3/245 1234").
fn parse_runnable(loadavg: &[u8]) -> Option<usize> {
    let field = loadavg.split(|b| b.is_ascii_whitespace()).nth(3)?;
    let runnable = field.split(|&b| b == b'/').next()?;
    std::str::from_utf8(runnable).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loadavg_is_parsed() {
        assert_eq!(parse_runnable(b"0.01 0.02 0.03 3/245 1234\n"), Some(3));
        assert_eq!(parse_runnable(b"0.01 0.02"), None);
        assert_eq!(parse_runnable(b"a b c x/1 2"), None);
        assert!(runnable_tasks() >= 1, "this test is running");
    }

    #[test]
    fn the_load_sensor_yields_to_its_own_crowd_at_once_and_to_others_when_steady() {
        let mut sensor = LoadSensor {
            recent: [2; LoadSensor::WINDOW],
            next: 0,
            cores: 2,
            peers: 2,
        };
        assert_eq!(sensor.spin(), Spin::DEFAULT);
        // A passing task in one sample, or three, changes nothing...
        for _ in 0..LoadSensor::WINDOW - 1 {
            assert_eq!(sensor.record(3), Spin::DEFAULT);
        }
        // ...a full window of them does...
        assert_eq!(sensor.record(9), Spin::YIELD_ONLY);
        assert_eq!(sensor.record(5), Spin::YIELD_ONLY);
        // ...and one quiet sample brings the spinning back.
        assert_eq!(sensor.record(2), Spin::DEFAULT);
        // A host oversubscribed from the start yields at once.
        let crowded = LoadSensor {
            recent: [9; LoadSensor::WINDOW],
            next: 0,
            cores: 2,
            peers: 0,
        };
        assert_eq!(crowded.spin(), Spin::YIELD_ONLY);
        // Our own spinners outnumbering the cores yield whatever the host
        // count says, and stop yielding when they no longer do.
        sensor.set_peers(3);
        assert_eq!(sensor.spin(), Spin::YIELD_ONLY);
        sensor.set_peers(2);
        assert_eq!(sensor.spin(), Spin::DEFAULT);
        assert!(runnable_tasks() >= 1, "the reader itself runs");
    }
}
