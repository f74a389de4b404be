//! Eviction policies other than LRU: SGLang 0.5.23's
//! `--radix-eviction-policy` strategies (`mem_cache/evict_policy.py`), the
//! per-node facts their keys read, and the heap of unlocked leaves ordered
//! by those keys.
//!
//! SGLang's `RadixCache.evict` heaps every evictable leaf by its strategy's
//! tuple and pops the least, pushing a parent its victim left an evictable
//! leaf. Here the heap lives between calls: a node enters it when it becomes
//! an unlocked leaf and leaves it when it stops being one, and every change
//! of a fact its key reads (a use, an insert through it, a split) moves it
//! in O(log n). So eviction still never visits a locked or inner node
//! (seed 000), whatever the policy: it pops what it evicts.
//!
//! The facts, per node slot, as SGLang's `TreeNode` keeps them:
//! - last use: `Lru`'s stamp (a counter: no two nodes tie, and SGLang's
//!   `time.monotonic()` orders the same events the same way);
//! - creation: a stamp of the same counter when the node was made; a
//!   split's upper half is made then under [`Recency::Sglang`] (SGLang's
//!   `_split_node` builds a new `TreeNode`), and keeps the node's under
//!   [`Recency::Exact`] (its tokens are as old as the node's; SGLang's
//!   unified tree core does the same);
//! - hits: inserts through the node past what the inserting request
//!   inserted before (`InsertParams.inserted_len`), copied by a split;
//! - priority: the most of the inserts through it (`InsertParams.priority`),
//!   copied by a split;
//! - T-LRU's tokens above the node (`_tlru_cached_prefix_len - len(key)`)
//!   and the branch's high-water depth (`_tlru_history_len`).
//!
//! [`Recency::Sglang`]: super::Recency::Sglang
//! [`Recency::Exact`]: super::Recency::Exact

use std::fmt;
use std::str::FromStr;

use super::heap::{Entry, Heap};

/// Which unlocked leaf eviction takes first: SGLang 0.5.23's
/// `--radix-eviction-policy`, with its `--radix-eviction-policy-config`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Policy {
    /// Least recently used (`last_access_time`).
    #[default]
    Lru,
    /// Fewest hits, then least recently used (`(hit_count,
    /// last_access_time)`).
    Lfu,
    /// Oldest first (`creation_time`).
    Fifo,
    /// Most recently used first (`-last_access_time`).
    Mru,
    /// Newest first (`-creation_time`).
    Filo,
    /// Lowest priority, then least recently used (`(priority,
    /// last_access_time)`).
    Priority,
    /// Tail-optimized LRU (arXiv:2510.15152): a node whose tokens lie past
    /// what its conversation needs to keep under the TTFT budget first,
    /// then least recently used. Token counts, as SGLang's.
    Tlru {
        threshold: i64,
        next_prompt_estimate: i64,
    },
    /// Segmented LRU: nodes with fewer than `protected_threshold` hits
    /// (probationary) first, each segment least recently used first.
    Slru { protected_threshold: i64 },
}

/// Why a policy name or its parameters were refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicyError {
    /// Not one of SGLang's policy names.
    Unknown(String),
    /// A parameter the policy does not take (SGLang: a `TypeError` at
    /// start-up, naming the key and the policy).
    Parameter { policy: &'static str, key: String },
    /// T-LRU's parameters as SGLang's server refuses them: negative, or a
    /// threshold not above the next prompt's estimate (no token is ever
    /// TEL-safe then: T-LRU is LRU).
    Tlru {
        threshold: i64,
        next_prompt_estimate: i64,
    },
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unknown(name) => write!(
                f,
                "unknown eviction policy {name:?}: expected one of {}",
                Policy::NAMES.join(", ")
            ),
            Self::Parameter { policy, key } => {
                let takes = Policy::parameters_of(policy);
                if takes.is_empty() {
                    write!(
                        f,
                        "eviction policy {policy} takes no parameter, got {key:?}"
                    )
                } else {
                    write!(
                        f,
                        "eviction policy {policy} takes {}, got {key:?}",
                        takes.join(" and ")
                    )
                }
            }
            Self::Tlru {
                threshold,
                next_prompt_estimate,
            } => write!(
                f,
                "eviction policy tlru needs 0 <= next_prompt_estimate < threshold, got threshold \
                 {threshold} and next_prompt_estimate {next_prompt_estimate}"
            ),
        }
    }
}

impl std::error::Error for PolicyError {}

impl Policy {
    /// Every policy's name, as SGLang spells them.
    pub const NAMES: [&'static str; 8] = [
        "lru", "lfu", "fifo", "mru", "filo", "priority", "tlru", "slru",
    ];

    /// SGLang's default `protected_threshold` of S-LRU.
    pub const SLRU_THRESHOLD: i64 = 2;

    /// The policy's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Lru => "lru",
            Self::Lfu => "lfu",
            Self::Fifo => "fifo",
            Self::Mru => "mru",
            Self::Filo => "filo",
            Self::Priority => "priority",
            Self::Tlru { .. } => "tlru",
            Self::Slru { .. } => "slru",
        }
    }

    /// The parameters the policy named `name` takes, in order.
    pub fn parameters_of(name: &str) -> &'static [&'static str] {
        match name {
            "tlru" => &["threshold", "next_prompt_estimate"],
            "slru" => &["protected_threshold"],
            _ => &[],
        }
    }

    /// The policy's parameters and their values, in
    /// [`Self::parameters_of`]'s order.
    pub fn parameters(self) -> Vec<(&'static str, i64)> {
        match self {
            Self::Tlru {
                threshold,
                next_prompt_estimate,
            } => vec![
                ("threshold", threshold),
                ("next_prompt_estimate", next_prompt_estimate),
            ],
            Self::Slru {
                protected_threshold,
            } => vec![("protected_threshold", protected_threshold)],
            _ => Vec::new(),
        }
    }

    /// The policy `name` with `params` (SGLang's
    /// `--radix-eviction-policy-config` keys; a key left out takes
    /// SGLang's default: 0 for T-LRU's, 2 for S-LRU's). A key the policy
    /// does not take is refused, as SGLang refuses it.
    pub fn with_parameters(name: &str, params: &[(&str, i64)]) -> Result<Self, PolicyError> {
        let name = name.trim().to_ascii_lowercase();
        let Some(&known) = Self::NAMES.iter().find(|&&n| n == name) else {
            return Err(PolicyError::Unknown(name));
        };
        let takes = Self::parameters_of(known);
        if let Some((key, _)) = params.iter().find(|(k, _)| !takes.contains(k)) {
            return Err(PolicyError::Parameter {
                policy: known,
                key: (*key).to_owned(),
            });
        }
        let get = |key: &str, default: i64| {
            params
                .iter()
                .rev()
                .find(|(k, _)| *k == key)
                .map_or(default, |&(_, v)| v)
        };
        Ok(match known {
            "lru" => Self::Lru,
            "lfu" => Self::Lfu,
            "fifo" => Self::Fifo,
            "mru" => Self::Mru,
            "filo" => Self::Filo,
            "priority" => Self::Priority,
            "tlru" => Self::Tlru {
                threshold: get("threshold", 0),
                next_prompt_estimate: get("next_prompt_estimate", 0),
            },
            _ => Self::Slru {
                protected_threshold: get("protected_threshold", Self::SLRU_THRESHOLD),
            },
        })
    }

    /// SGLang's server-side check of the parameters (`kv_cache_hook.py`):
    /// T-LRU's must be non-negative with the threshold above the next
    /// prompt's estimate. What `radixd serve` runs; an engine takes any.
    pub fn check(self) -> Result<(), PolicyError> {
        match self {
            Self::Tlru {
                threshold,
                next_prompt_estimate,
            } if threshold < 0 || next_prompt_estimate < 0 || threshold <= next_prompt_estimate => {
                Err(PolicyError::Tlru {
                    threshold,
                    next_prompt_estimate,
                })
            }
            _ => Ok(()),
        }
    }

    /// The policy's words for a segment: its index in [`Self::NAMES`] and
    /// its parameters (zero where it has none).
    pub fn to_words(self) -> [u64; 3] {
        let code = Self::NAMES
            .iter()
            .position(|&n| n == self.name())
            .unwrap_or(0) as u64;
        let mut words = [code, 0, 0];
        for (slot, (_, v)) in words[1..].iter_mut().zip(self.parameters()) {
            *slot = v as u64;
        }
        words
    }

    /// The policy [`Self::to_words`] wrote; `None` for a code naming none.
    pub fn from_words(words: [u64; 3]) -> Option<Self> {
        let name = *Self::NAMES.get(usize::try_from(words[0]).ok()?)?;
        let params: Vec<(&str, i64)> = Self::parameters_of(name)
            .iter()
            .zip(&words[1..])
            .map(|(&k, &v)| (k, v as i64))
            .collect();
        Self::with_parameters(name, &params).ok()
    }

    /// Whether the order reads anything besides last use (every policy
    /// but LRU keeps its candidates in a heap keyed by its order).
    pub fn is_lru(self) -> bool {
        self == Self::Lru
    }
}

impl fmt::Display for Policy {
    /// The name, and the parameters in SGLang's config form when there
    /// are any: `tlru {"threshold": 4096, "next_prompt_estimate": 512}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())?;
        let params = self.parameters();
        if !params.is_empty() {
            let body: Vec<String> = params
                .iter()
                .map(|(k, v)| format!("\"{k}\": {v}"))
                .collect();
            write!(f, " {{{}}}", body.join(", "))?;
        }
        Ok(())
    }
}

impl FromStr for Policy {
    type Err = PolicyError;

    /// A name alone, with SGLang's default parameters.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::with_parameters(s, &[])
    }
}

/// What an insert tells the eviction policy (SGLang's `InsertParams`
/// beyond the key and value). The default is what an insert without them
/// means: priority 0, nothing inserted before.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct InsertHints {
    /// The request's priority (`InsertParams.priority`): each node the
    /// insert passes keeps the most of its inserts'.
    pub priority: i64,
    /// Tokens of the key this request inserted before
    /// (`InsertParams.inserted_len`): nodes ending within them are not
    /// counted as hit again.
    pub inserted_len: u64,
}

/// A key of the heap: compared as SGLang compares its strategy's tuples
/// (the second word breaks ties, as SGLang's `TreeNode.__lt__` does).
pub(crate) type Key = (u64, u64);

/// The candidates of a policy other than LRU and the facts their keys
/// read, per node slot.
#[derive(Debug)]
pub(crate) struct Keyed {
    pub policy: Policy,
    pub heap: Heap<Key>,
    /// Each slot's creation stamp.
    pub created: Vec<u64>,
    pub hits: Vec<u64>,
    pub priority: Vec<i64>,
    /// T-LRU: tokens from the root to the node's first page.
    pub above: Vec<u64>,
    /// T-LRU: the deepest end (tokens) the node's branch ever reached.
    pub history: Vec<u64>,
}

/// Flips the sign bit, so that unsigned order is signed order.
fn ordered(x: i64) -> u64 {
    (x as u64) ^ (1 << 63)
}

impl Keyed {
    /// No candidates, over `nodes` node slots. The per-slot facts are
    /// zeroed vectors, committed by the operating system as slots are used
    /// (and only those the policy reads ever are).
    pub fn new(policy: Policy, nodes: u32) -> Self {
        let n = nodes as usize;
        Self {
            policy,
            heap: Heap::new(),
            created: vec![0; n],
            hits: vec![0; n],
            priority: vec![0; n],
            above: vec![0; n],
            history: vec![0; n],
        }
    }

    /// Whether the policy reads T-LRU's facts (only then are they kept).
    pub fn tlru(&self) -> bool {
        matches!(self.policy, Policy::Tlru { .. })
    }

    /// The key of `node`, last used at `last`: SGLang's strategy tuple.
    pub fn key(&self, node: u32, last: u64) -> Key {
        let i = node as usize;
        match self.policy {
            Policy::Lru => (0, last),
            Policy::Lfu => (self.hits[i], last),
            Policy::Fifo => (self.created[i], last),
            Policy::Mru => (!last, 0),
            Policy::Filo => (!self.created[i], last),
            Policy::Priority => (ordered(self.priority[i]), last),
            Policy::Tlru {
                threshold,
                next_prompt_estimate,
            } => {
                // SGLang: budget = max(L + Q - threshold, 0); TEL-safe
                // (first to go) when the tokens above the node cover it.
                let budget = (i128::from(self.history[i]) + i128::from(next_prompt_estimate)
                    - i128::from(threshold))
                .max(0);
                let safe = i128::from(self.above[i]) >= budget;
                (u64::from(!safe), last)
            }
            Policy::Slru {
                protected_threshold,
            } => {
                let protected = i128::from(self.hits[i]) >= i128::from(protected_threshold);
                (u64::from(protected), last)
            }
        }
    }

    /// Adds `node`, last used at `last`.
    pub fn push(&mut self, slot: &mut [u32], node: u32, last: u64) {
        let key = self.key(node, last);
        self.heap.push(slot, Entry { key, node });
    }
}
