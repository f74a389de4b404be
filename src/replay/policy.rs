//! The policy interface the replay driver runs. The policies implement it;
//! `registry` builds them by name (so the arrows point one way: registry →
//! policies → this module).

/// A cache policy replayed one request at a time.
pub trait Policy {
    /// The policy's name as printed in the `policy` output field.
    fn name(&self) -> &'static str;

    /// Handles one request whose prompt is `blocks`: returns the prefix hit
    /// `k` (how many leading blocks were resident on arrival) and updates the
    /// cache state for the whole request.
    fn request(&mut self, blocks: &[u64]) -> usize;

    /// Blocks resident now; never more than the capacity.
    fn resident_blocks(&self) -> usize;
}

/// A cache of individual blocks with no notion of prefixes; every one is a
/// [`Policy`] (the impl below).
pub(crate) trait FlatCache {
    /// The policy's name (see [`Policy::name`]).
    const NAME: &'static str;
    /// Whether `id` is resident; changes no state.
    fn contains(&self, id: u64) -> bool;
    /// Touches `id`: a hit updates its state, a miss admits it (and may evict).
    fn access(&mut self, id: u64);
    /// Blocks resident now (see [`Policy::resident_blocks`]).
    fn resident(&self) -> usize;
}

impl<C: FlatCache> Policy for C {
    fn name(&self) -> &'static str {
        C::NAME
    }

    /// Prefix scan first (read-only, stops at the first miss), then every
    /// block of the request is accessed in order, hit or miss.
    fn request(&mut self, blocks: &[u64]) -> usize {
        let k = blocks.iter().take_while(|&&id| self.contains(id)).count();
        for &id in blocks {
            self.access(id);
        }
        k
    }

    fn resident_blocks(&self) -> usize {
        self.resident()
    }
}
