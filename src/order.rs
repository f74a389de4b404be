//! Cache-aware scheduling order: which waiting prompt to run first, from
//! lock-free peeks of the shared tree (no round trip per prompt).
//!
//! Two policies of the SGLang paper (Zheng et al., "SGLang: Efficient
//! Execution of Structured Language Model Programs", §3 and Appendix A.3)
//! as SGLang's scheduler implements them
//! (`python/sglang/srt/managers/schedule_policy.py`, and `_dfs_weight_order`
//! in `python/sglang/srt/mem_cache/base_prefix_cache.py`):
//!
//! - [`Policy::Lpm`], longest prefix match first: prompts sorted by matched
//!   length, longest first; ties keep their arrival order (a stable sort, as
//!   Python's `list.sort`).
//! - [`Policy::DfsWeight`]: the matched prefixes form a trie; each node
//!   weighs as many prompts as end in its subtree. A depth-first walk visits
//!   children heaviest first (ties in order of first appearance) and emits
//!   the prompts ending at a node after its children, so prompts that share
//!   the most cached state run back to back. Unmatched prompts end at the
//!   root and come last.
//!
//! The trie is built over the matched *pages*, not tokens: two prompts share
//! a cached prefix exactly when they share its page ids, and a page stands
//! for `page_size` tokens, so the walk is `page_size` times shorter.

use std::fmt;
use std::str::FromStr;

use crate::client::{Client, ClientError};
use crate::engine::{Engine, Region};

/// How often a peek that collides with the daemon's writes is retried
/// before the prompt is taken as unmatched (an order is a hint).
const PEEK_TRIES: usize = 4;

/// A scheduling policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Policy {
    /// Longest prefix match first (`"lpm"`).
    Lpm,
    /// Depth-first by subtree weight (`"dfs-weight"`).
    DfsWeight,
}

impl Policy {
    /// The policy's name, as [`FromStr`] reads it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Lpm => "lpm",
            Self::DfsWeight => "dfs-weight",
        }
    }
}

/// A policy name that is neither `lpm` nor `dfs-weight`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownPolicy(pub String);

impl fmt::Display for UnknownPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown policy {:?} (expected \"lpm\" or \"dfs-weight\")",
            self.0
        )
    }
}

impl std::error::Error for UnknownPolicy {}

impl FromStr for Policy {
    type Err = UnknownPolicy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "lpm" => Ok(Self::Lpm),
            "dfs-weight" | "dfs_weight" => Ok(Self::DfsWeight),
            other => Err(UnknownPolicy(other.to_owned())),
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The order in which to run `matched` prompts under `policy`: indices into
/// `matched`, each once. `matched[i]` holds the page ids of prompt `i`'s
/// cached prefix (its length in tokens is `pages × page_size`).
pub fn order_matched<P: AsRef<[u32]>>(matched: &[P], policy: Policy) -> Vec<usize> {
    match policy {
        Policy::Lpm => {
            let mut order: Vec<usize> = (0..matched.len()).collect();
            // Stable: equal matches keep their arrival order.
            order.sort_by_key(|&i| std::cmp::Reverse(matched[i].as_ref().len()));
            order
        }
        Policy::DfsWeight => Trie::build(matched).dfs_weight_order(),
    }
}

/// Peeks every prompt with `peek` (matched length and pages), then orders
/// them under `policy`.
pub fn order_by<T, E>(
    prompts: &[T],
    policy: Policy,
    mut peek: impl FnMut(&[u32]) -> Result<Vec<u32>, E>,
) -> Result<Vec<usize>, E>
where
    T: AsRef<[u32]>,
{
    let matched = prompts
        .iter()
        .map(|p| peek(p.as_ref()))
        .collect::<Result<Vec<_>, E>>()?;
    Ok(order_matched(&matched, policy))
}

impl Client {
    /// The order in which to run `prompts` (token ids each) under `policy`,
    /// as indices into `prompts`, from lock-free peeks of the shared tree:
    /// no round trip, no lock, no LRU touch.
    pub fn order<T: AsRef<[u32]>>(
        &self,
        prompts: &[T],
        policy: Policy,
    ) -> Result<Vec<usize>, ClientError> {
        order_by(prompts, policy, |tokens| self.matched_pages(tokens))
    }

    /// The pages of the cached prefix of `tokens`, from a lock-free peek,
    /// as [`order_matched`] takes them. A read that keeps colliding with
    /// the daemon's writes counts as no match (an order is a hint).
    pub fn matched_pages(&self, tokens: &[u32]) -> Result<Vec<u32>, ClientError> {
        for _ in 0..PEEK_TRIES {
            match self.peek(tokens) {
                Ok((_, pages)) => return Ok(pages),
                Err(ClientError::Contended) => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(Vec::new())
    }
}

/// The same order from an in-process engine (tests, simulation).
pub fn order_engine<R: Region, T: AsRef<[u32]>>(
    engine: &Engine<R>,
    prompts: &[T],
    policy: Policy,
) -> Vec<usize> {
    let result: Result<_, std::convert::Infallible> = order_by(prompts, policy, |tokens| {
        let mut pages = Vec::new();
        if engine.components().is_full_only() {
            engine.peek(tokens, &mut pages);
        } else {
            // What a match would serve (the components' cut), as a
            // client's peek reads it.
            engine.peek_usable(tokens, &mut pages);
        }
        Ok(pages)
    });
    match result {
        Ok(order) => order,
        Err(never) => match never {},
    }
}

/// A compressed trie of matched page sequences.
struct Trie<'a, P> {
    paths: &'a [P],
    nodes: Vec<TrieNode>,
}

/// One trie node: its edge is `paths[owner][start..end]`.
struct TrieNode {
    owner: usize,
    start: usize,
    end: usize,
    /// In creation order, which follows first appearance among the prompts.
    children: Vec<usize>,
    /// Prompts whose match ends exactly here.
    here: Vec<usize>,
    /// Prompts ending in this subtree.
    weight: usize,
}

const ROOT: usize = 0;

impl<'a, P: AsRef<[u32]>> Trie<'a, P> {
    fn build(paths: &'a [P]) -> Self {
        let mut trie = Self {
            paths,
            nodes: vec![TrieNode {
                owner: 0,
                start: 0,
                end: 0,
                children: Vec::new(),
                here: Vec::new(),
                weight: 0,
            }],
        };
        for i in 0..paths.len() {
            trie.insert(i);
        }
        trie
    }

    fn edge(&self, node: usize) -> &'a [u32] {
        let n = &self.nodes[node];
        &self.paths[n.owner].as_ref()[n.start..n.end]
    }

    fn insert(&mut self, prompt: usize) {
        let path = self.paths[prompt].as_ref();
        let (mut node, mut pos) = (ROOT, 0);
        loop {
            self.nodes[node].weight += 1;
            if pos == path.len() {
                self.nodes[node].here.push(prompt);
                return;
            }
            let first = path[pos];
            let slot = self.nodes[node]
                .children
                .iter()
                .position(|&c| self.edge(c).first() == Some(&first));
            let Some(slot) = slot else {
                let leaf = self.nodes.len();
                self.nodes.push(TrieNode {
                    owner: prompt,
                    start: pos,
                    end: path.len(),
                    children: Vec::new(),
                    here: vec![prompt],
                    weight: 1,
                });
                self.nodes[node].children.push(leaf);
                return;
            };
            let child = self.nodes[node].children[slot];
            let edge = self.edge(child);
            let common = edge
                .iter()
                .zip(&path[pos..])
                .take_while(|(a, b)| a == b)
                .count();
            if common < edge.len() {
                // Split the child's edge: a middle node takes the common
                // part, its weight and its place among the siblings.
                let mid = self.nodes.len();
                let c = &self.nodes[child];
                let (owner, start, weight) = (c.owner, c.start, c.weight);
                self.nodes.push(TrieNode {
                    owner,
                    start,
                    end: start + common,
                    children: vec![child],
                    here: Vec::new(),
                    weight,
                });
                self.nodes[child].start = start + common;
                self.nodes[node].children[slot] = mid;
                node = mid;
            } else {
                node = child;
            }
            pos += common;
        }
    }

    /// Children heaviest first, a node's own prompts after its subtrees.
    fn dfs_weight_order(mut self) -> Vec<usize> {
        let weights: Vec<usize> = self.nodes.iter().map(|n| n.weight).collect();
        for n in &mut self.nodes {
            // Stable: equal weights keep first-appearance order (a split's
            // middle node takes its child's place among the siblings).
            n.children.sort_by_key(|&c| std::cmp::Reverse(weights[c]));
        }
        let mut order = Vec::with_capacity(self.paths.len());
        // (node, children already pushed)
        let mut stack = vec![(ROOT, false)];
        while let Some((node, expanded)) = stack.pop() {
            if expanded {
                order.extend_from_slice(&self.nodes[node].here);
                continue;
            }
            stack.push((node, true));
            stack.extend(self.nodes[node].children.iter().rev().map(|&c| (c, false)));
        }
        order
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Config;

    /// Page size 1, so a prompt's matched pages are its matched tokens'
    /// pages one for one.
    fn engine_with(keys: &[&[u32]]) -> Engine {
        let mut engine = Engine::new(Config {
            page_size: 1,
            capacity: 1024,
        })
        .expect("engine");
        for key in keys {
            let pages = engine.alloc(0, key.len() as u64).expect("alloc");
            engine.insert(0, key, &pages, false).expect("insert");
        }
        engine
    }

    /// The tree:
    ///
    /// ```text
    /// root ─ 1 2 3 4 5 6 7 8          (one long branch)
    ///      └ 9 ─ 10 ─ 11              (a short branch, three ways)
    ///             └ 12
    ///        └ 13
    /// ```
    ///
    /// One prompt matches the long branch deeply; three prompts share the
    /// short branch. LPM runs the deep one first; DFS-weight runs the three
    /// that share `9` back to back, first.
    #[test]
    fn lpm_and_dfs_weight_differ_on_a_hand_made_tree() {
        let engine = engine_with(&[
            &[1, 2, 3, 4, 5, 6, 7, 8],
            &[9, 10, 11],
            &[9, 10, 12],
            &[9, 13],
        ]);
        let prompts: Vec<Vec<u32>> = vec![
            vec![9, 13, 50],                  // 0: matches 2 (9 13)
            vec![1, 2, 3, 4, 5, 6, 7, 8, 60], // 1: matches 8
            vec![70, 71],                     // 2: matches nothing
            vec![9, 10, 11, 80],              // 3: matches 3 (9 10 11)
            vec![9, 10, 12],                  // 4: matches 3 (9 10 12)
        ];
        let lpm = order_engine(&engine, &prompts, Policy::Lpm);
        assert_eq!(lpm, vec![1, 3, 4, 0, 2]);
        let dfs = order_engine(&engine, &prompts, Policy::DfsWeight);
        // Under 9 weigh three prompts (0, 3, 4), under 1 one. Under 9,
        // `9 10` weighs two (3, 4) and `9 13` one (0).
        assert_eq!(dfs, vec![3, 4, 0, 1, 2]);
        assert_ne!(lpm, dfs);
    }

    #[test]
    fn a_prompt_ending_at_an_inner_node_follows_that_nodes_subtree() {
        // Matched pages, directly: prompt 0 ends at `1 2`, which prompts 1
        // and 2 extend; prompt 3 shares nothing.
        let matched: Vec<Vec<u32>> = vec![vec![1, 2], vec![1, 2, 3], vec![1, 2, 4, 5], vec![7]];
        assert_eq!(order_matched(&matched, Policy::DfsWeight), vec![1, 2, 0, 3]);
        assert_eq!(order_matched(&matched, Policy::Lpm), vec![2, 1, 0, 3]);
    }

    #[test]
    fn equal_weights_keep_first_appearance_and_every_prompt_appears_once() {
        let matched: Vec<Vec<u32>> = vec![vec![5], vec![], vec![3], vec![5, 6], vec![3, 4], vec![]];
        let dfs = order_matched(&matched, Policy::DfsWeight);
        assert_eq!(dfs, vec![3, 0, 4, 2, 1, 5]);
        let mut sorted = dfs.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..matched.len()).collect::<Vec<_>>());
        assert!(order_matched::<Vec<u32>>(&[], Policy::DfsWeight).is_empty());
    }

    /// The same tree through a daemon: `Client::order` peeks the shared
    /// tree and agrees with the engine, and touches nothing.
    #[test]
    fn client_order_through_a_daemon() {
        use crate::daemon::{serve, ServeConfig};
        use radixd_ipc::sync::{AtomicU32, Ordering};
        use std::time::Duration;

        let name = format!("radixd-order-test-{}", std::process::id());
        let config = ServeConfig {
            name: name.clone(),
            page_size: 1,
            capacity: 1024,
            max_clients: 2,
            scratch_bytes: 1 << 16,
            ..ServeConfig::default()
        };
        static STOP: AtomicU32 = AtomicU32::new(0);
        let daemon = std::thread::spawn(move || serve(&config, &STOP));
        let mut client = Client::connect_waiting(&name, Duration::from_secs(10)).expect("connect");
        for key in [
            &[1, 2, 3, 4, 5, 6, 7, 8][..],
            &[9, 10, 11],
            &[9, 10, 12],
            &[9, 13],
        ] {
            let pages = client.alloc(key.len() as u64).expect("alloc");
            client.insert(key, &pages, false).expect("insert");
        }
        let prompts: Vec<Vec<u32>> = vec![
            vec![9, 13, 50],
            vec![1, 2, 3, 4, 5, 6, 7, 8, 60],
            vec![70, 71],
            vec![9, 10, 11, 80],
            vec![9, 10, 12],
        ];
        let before = client.stats().expect("stats");
        assert_eq!(
            client.order(&prompts, Policy::Lpm).expect("lpm"),
            vec![1, 3, 4, 0, 2]
        );
        assert_eq!(
            client.order(&prompts, Policy::DfsWeight).expect("dfs"),
            vec![3, 4, 0, 1, 2]
        );
        assert_eq!(client.stats().expect("stats"), before);
        drop(client);
        STOP.store(1, Ordering::Relaxed); // Relaxed: a lone stop flag.
        daemon.join().expect("daemon thread").expect("serve");
    }

    #[test]
    fn policies_parse_by_name() {
        assert_eq!("lpm".parse(), Ok(Policy::Lpm));
        assert_eq!("dfs-weight".parse(), Ok(Policy::DfsWeight));
        assert!("fcfs".parse::<Policy>().is_err());
        assert_eq!(Policy::DfsWeight.to_string(), "dfs-weight");
    }
}
