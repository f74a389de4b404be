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

/// A cache of individual blocks with no notion of prefixes; [`flat_request`]
/// turns one into a [`Policy`].
pub(crate) trait FlatCache {
    /// Whether `id` is resident; changes no state.
    fn contains(&self, id: u64) -> bool;
    /// Touches `id`: a hit updates its state, a miss admits it (and may evict).
    fn access(&mut self, id: u64);
}

/// Prefix scan first (read-only, stops at the first miss), then every block
/// of the request is accessed in order, hit or miss.
pub(crate) fn flat_request<C: FlatCache>(cache: &mut C, blocks: &[u64]) -> usize {
    let k = blocks.iter().take_while(|&&id| cache.contains(id)).count();
    for &id in blocks {
        cache.access(id);
    }
    k
}
