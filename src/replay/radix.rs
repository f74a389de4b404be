//! The engine's own policy, replayed through the real engine as a scheduler
//! drives it: match (touching the path), lock the match, allocate pages for
//! the rest (only as many as free plus evictable pages allow), insert, unlock.
//!
//! With page size 1 and one token per block this is: blocks form a tree by
//! prefix; a full cache evicts the least recently used leaf that is not on
//! the current request's path; when none is left, the rest of the request is
//! not cached.

use super::hash::{id_map, IdMap};
use super::policy::Policy;
use super::ReplayError;
use crate::engine::ConfigError;
use crate::engine::{Components, Config, Engine, InsertExtra};

/// The only client of the replay engine.
const SCHEDULER: u32 = 0;

/// The radix engine behind the [`Policy`] interface.
pub struct Radix {
    engine: Engine,
    /// Block id → token; ids are interned so any `u64` id maps exactly.
    tokens_of: IdMap<u32>,
    tokens: Vec<u32>,
    pages: Vec<u32>,
    name: &'static str,
}

impl Radix {
    /// [`Radix::new`] caching `components` beside FULL, as a hybrid
    /// model's scheduler does: SWA pages paired with every page (the SWA
    /// pool evicts on its own), or a state checkpointed at the end of
    /// every prompt cached whole.
    pub fn with_components(capacity: usize, components: Components) -> Result<Self, ReplayError> {
        let mut r = Self::new(capacity)?;
        r.engine
            .set_components(components)
            .map_err(|e| ReplayError::Components(e.to_string()))?;
        r.name = match (components.swa.is_some(), components.mamba.is_some()) {
            (false, false) => "radix",
            (true, false) => "radix+swa",
            (false, true) => "radix+mamba",
            (true, true) => "radix+swa+mamba",
        };
        Ok(r)
    }

    /// This policy with a split counting as `recency` says (exact by
    /// default).
    pub fn with_recency(mut self, recency: crate::engine::Recency) -> Self {
        self.engine.set_recency(recency);
        self
    }

    /// An empty engine of `capacity` one-token pages.
    pub fn new(capacity: usize) -> Result<Self, ReplayError> {
        let too_large = || ReplayError::CapacityTooLarge {
            capacity,
            max: crate::engine::layout::MAX_CAPACITY as usize,
        };
        let capacity = u32::try_from(capacity).map_err(|_| too_large())?;
        let engine = Engine::new(Config {
            page_size: 1,
            capacity,
        })
        .map_err(|e| match e {
            ConfigError::Capacity(_) => too_large(),
            e => ReplayError::Engine(e),
        })?;
        Ok(Self {
            engine,
            tokens_of: id_map(0),
            tokens: Vec::new(),
            pages: Vec::new(),
            name: "radix",
        })
    }
}

impl Policy for Radix {
    fn name(&self) -> &'static str {
        self.name
    }

    fn request(&mut self, blocks: &[u64]) -> usize {
        self.tokens.clear();
        for &id in blocks {
            let fresh = self.tokens_of.len() as u32;
            self.tokens.push(*self.tokens_of.entry(id).or_insert(fresh));
        }
        let e = &mut self.engine;
        let (matched, _) = e.match_with(SCHEDULER, &self.tokens, true, &mut self.pages);
        let hit = matched.len;
        let stats = e.stats();
        let room = stats.free_pages + stats.evictable_tokens;
        let rest = (self.tokens.len() - hit) as u64;
        let want = rest.min(room);
        // `want` fits what can be freed and every page is the matched one
        // at its place or freshly owned; only a short SWA pool can refuse.
        if let Ok(fresh) = e.alloc(SCHEDULER, want) {
            self.pages.extend_from_slice(&fresh);
            let key = &self.tokens[..self.pages.len()];
            // A recurrent state is a checkpoint of the whole prompt.
            let state = (want == rest)
                .then(|| e.alloc_state(SCHEDULER).ok())
                .flatten();
            let extra = InsertExtra {
                mamba_state: state,
                swa_evicted: 0,
            };
            match e.insert_with(SCHEDULER, key, &self.pages, false, extra) {
                Ok((_, x)) if x.mamba_exist => {
                    if let Some(s) = state {
                        let _ = e.free_state(SCHEDULER, u64::from(s));
                    }
                }
                Ok(_) => {}
                Err(_) => {
                    let _ = e.free(SCHEDULER, &fresh);
                    if let Some(s) = state {
                        let _ = e.free_state(SCHEDULER, u64::from(s));
                    }
                }
            }
        }
        if let Some(handle) = matched.handle {
            let _ = e.unlock(SCHEDULER, handle.to_raw());
        }
        hit
    }

    fn resident_blocks(&self) -> usize {
        self.engine.stats().total_tokens as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_current_path_is_never_evicted_for_its_own_request() {
        let mut r = Radix::new(3).unwrap();
        assert_eq!(r.request(&[1, 2]), 0);
        assert_eq!(r.request(&[3]), 0); // full: 1,2 | 3
                                        // [1,2,4]: 1,2 hit and are locked; 4 evicts the LRU leaf [3].
        assert_eq!(r.request(&[1, 2, 4]), 2);
        assert_eq!(r.request(&[3]), 0);
        // Longer than the cache: only what fits is cached.
        let mut r = Radix::new(2).unwrap();
        assert_eq!(r.request(&[7, 8, 9]), 0);
        assert_eq!(r.resident_blocks(), 2);
        assert_eq!(r.request(&[7, 8, 9]), 2);
        r.engine.validate().unwrap();
    }

    #[test]
    fn hybrid_models_hit_only_where_every_component_can_serve() {
        use crate::engine::{MambaConfig, SwaConfig};
        let swa = Components {
            swa: Some(SwaConfig {
                window: 1,
                capacity: 2,
            }),
            mamba: None,
        };
        let mut r = Radix::with_components(8, swa).unwrap();
        assert_eq!(r.name(), "radix+swa");
        assert_eq!(r.request(&[1, 2]), 0);
        assert_eq!(r.request(&[1, 2, 3]), 2);
        // Two SWA pages for three cached blocks: block 1 lost its SWA
        // page, but the one-block window ending at 2 still holds.
        assert_eq!(r.request(&[1, 2]), 2);
        assert_eq!(r.request(&[1]), 0);
        r.engine.validate().unwrap();
        let mamba = Components {
            swa: None,
            mamba: Some(MambaConfig { capacity: 4 }),
        };
        let mut r = Radix::with_components(8, mamba).unwrap();
        assert_eq!(r.request(&[1, 2, 3]), 0);
        // A state at [1, 2, 3] only: [1, 2, 4] cannot resume at [1, 2].
        assert_eq!(r.request(&[1, 2, 4]), 0);
        assert_eq!(r.request(&[1, 2, 3, 5]), 3);
        r.engine.validate().unwrap();
    }
}
