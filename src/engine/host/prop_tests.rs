//! The host tier's property test: a random workload under every
//! eviction policy, every page any match answers checked against the KV
//! the workload wrote (see `every_page_a_match_answers_holds_its_tokens`).

use proptest::prelude::*;

use super::tests::{engine_under, P};
use super::HostMatched;
use crate::engine::{Engine, Policy};

/// One step of the random workload.
#[derive(Clone, Debug)]
enum Op {
    Insert(Vec<u32>),
    /// The ops naming an `Index` act on a key inserted before, cut to
    /// `usize` tokens at most (so that they meet the tree's nodes).
    Backup(prop::sample::Index, usize),
    Evict(u64),
    EvictHost(u64),
    LoadBack(prop::sample::Index, usize),
    Lock(prop::sample::Index, usize),
    UnlockAll,
    /// Pages of a key fetched from the L3 (holding its tokens), filed from
    /// the node a match of its first `usize` tokens ends at (the root when
    /// that is 0): an anchor with or without a copy, above device nodes,
    /// host-only ones or none.
    Prefetch(prop::sample::Index, usize, usize),
    HostLock(prop::sample::Index, usize),
    HostUnlockAll,
}

fn key() -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(0u32..3, 0..14)
}

fn op() -> impl Strategy<Value = Op> {
    let old = || (any::<prop::sample::Index>(), 2usize..14);
    prop_oneof![
        4 => key().prop_map(Op::Insert),
        4 => old().prop_map(|(i, n)| Op::Backup(i, n)),
        2 => (1u64..8).prop_map(Op::Evict),
        1 => (1u64..6).prop_map(Op::EvictHost),
        4 => old().prop_map(|(i, n)| Op::LoadBack(i, n)),
        1 => old().prop_map(|(i, n)| Op::Lock(i, n)),
        1 => Just(Op::UnlockAll),
        3 => (old(), 0usize..14).prop_map(|((i, n), cut)| Op::Prefetch(i, n, cut)),
        1 => old().prop_map(|(i, n)| Op::HostLock(i, n)),
        1 => Just(Op::HostUnlockAll),
    ]
}

/// What the KV of each device and host page holds, as the workload wrote
/// it: a page's tokens when it was computed or copied.
struct Kv {
    device: Vec<Vec<u32>>,
    host: Vec<Vec<u32>>,
    host_free: Vec<u32>,
}

impl Kv {
    /// Every page a match answers holds the key's tokens at its place.
    fn check(&self, e: &mut Engine, key: &[u32]) -> Result<HostMatched, TestCaseError> {
        let p = P as usize;
        let (mut device, mut host) = (Vec::new(), Vec::new());
        let m = e.match_host(key, &mut device, &mut host);
        prop_assert_eq!(device.len() * p, m.device_len);
        prop_assert_eq!(host.len() * p, m.host_len);
        for (i, &page) in device.iter().enumerate() {
            prop_assert_eq!(
                &self.device[page as usize],
                &key[i * p..(i + 1) * p].to_vec()
            );
        }
        for (i, &page) in host.iter().enumerate() {
            let at = device.len() + i;
            prop_assert_eq!(
                &self.host[page as usize],
                &key[at * p..(at + 1) * p].to_vec()
            );
        }
        Ok(m)
    }
}

fn policy() -> impl Strategy<Value = Policy> {
    prop_oneof![
        Just(Policy::Lru),
        Just(Policy::Lfu),
        Just(Policy::Fifo),
        Just(Policy::Mru),
        Just(Policy::Filo),
        Just(Policy::Priority),
        Just(Policy::Tlru {
            threshold: 6,
            next_prompt_estimate: 2
        }),
        Just(Policy::Slru {
            protected_threshold: 2
        }),
    ]
}

fn run(policy: Policy, ops: Vec<Op>) -> Result<(), TestCaseError> {
    const HOST: u32 = 12;
    let p = P as usize;
    let mut e = engine_under(policy, 10, HOST);
    let mut kv = Kv {
        device: vec![Vec::new(); 10],
        host: vec![Vec::new(); HOST as usize],
        host_free: (0..HOST).rev().collect(),
    };
    let mut locks = Vec::new();
    let mut host_locks = Vec::new();
    let mut keys: Vec<Vec<u32>> = Vec::new();
    for op in ops {
        let pick = |i: &prop::sample::Index, n: usize| -> Option<Vec<u32>> {
            let key = keys.get(i.index(keys.len().max(1)))?;
            Some(key[..n.min(key.len())].to_vec())
        };
        match op {
            Op::Insert(key) => {
                let n = key.len() / p;
                let Ok(pages) = e.alloc(1, n as u64) else {
                    continue;
                };
                for (i, &page) in pages.iter().enumerate() {
                    kv.device[page as usize] = key[i * p..(i + 1) * p].to_vec();
                }
                let ins = e
                    .insert(1, &key, &pages, false)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(ins.len, n * p);
                if n > 0 {
                    keys.push(key);
                }
            }
            Op::Backup(i, n) => {
                let Some(key) = pick(&i, n) else { continue };
                let m = kv.check(&mut e, &key)?;
                let Some(h) = m.device else { continue };
                let (mut device, mut host) = (Vec::new(), Vec::new());
                e.peek(&key, &mut device);
                let chain = e
                    .backup_chain(h.to_raw())
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let need: u32 = chain
                    .iter()
                    .map(|c| e.host_node(c.to_raw()).map_or(0, |n| n.device_pages))
                    .sum();
                if (kv.host_free.len() as u32) < need {
                    e.evict_host(u64::from(need), &mut host);
                    kv.host_free.extend(host.iter().copied());
                    if (kv.host_free.len() as u32) < need {
                        continue;
                    }
                    // Host eviction may have taken nothing on this path
                    // (the chain's nodes are device nodes), so the chain
                    // stands.
                }
                // The chain is the path's last `need` device pages.
                let mut at = device.len() - need as usize;
                for c in chain {
                    let n = e.host_node(c.to_raw()).map_or(0, |n| n.device_pages) as usize;
                    let pages: Vec<u32> = (0..n).filter_map(|_| kv.host_free.pop()).collect();
                    for (i, &hp) in pages.iter().enumerate() {
                        kv.host[hp as usize] = kv.device[device[at + i] as usize].clone();
                    }
                    at += n;
                    e.backup(c.to_raw(), &pages)
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                }
            }
            Op::Evict(n) => {
                e.evict(n * u64::from(P));
            }
            Op::EvictHost(n) => {
                let mut freed = Vec::new();
                e.evict_host(n, &mut freed);
                prop_assert!(freed.len() as u64 >= n || e.host_stats().is_some());
                kv.host_free.extend(freed);
            }
            Op::LoadBack(i, n) => {
                let Some(key) = pick(&i, n) else { continue };
                let m = kv.check(&mut e, &key)?;
                let Some(best) = m.best.filter(|_| m.host_len > 0) else {
                    continue;
                };
                let chain = e
                    .load_back_chain(best.to_raw())
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let n: usize = chain.iter().map(|(_, h)| h.len()).sum();
                prop_assert_eq!(n * p, m.host_len);
                // Lock the chain while pages are found, as SGLang does.
                let lock = e
                    .lock(1, best.to_raw())
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let got = e.alloc(1, n as u64);
                e.unlock(1, lock.to_raw())
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let Ok(pages) = got else { continue };
                let host: Vec<u32> = chain.into_iter().flat_map(|(_, h)| h).collect();
                for (&d, &h) in pages.iter().zip(&host) {
                    kv.device[d as usize] = kv.host[h as usize].clone();
                }
                e.load_back(1, best.to_raw(), &pages)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let after = kv.check(&mut e, &key)?;
                prop_assert_eq!(after.device_len, m.device_len + m.host_len);
            }
            Op::Lock(i, n) => {
                let Some(key) = pick(&i, n) else { continue };
                let m = kv.check(&mut e, &key)?;
                if let Some(best) = m.best {
                    locks.push(
                        e.lock(1, best.to_raw())
                            .map_err(|e| TestCaseError::fail(e.to_string()))?,
                    );
                }
            }
            Op::Prefetch(i, n, cut) => {
                let Some(key) = pick(&i, n) else { continue };
                let m = kv.check(&mut e, &key[..cut.min(key.len()) / p * p])?;
                let (anchor, from) = match m.best {
                    Some(h) => (Some(h.to_raw()), m.device_len + m.host_len),
                    None => (None, 0),
                };
                let want = (key.len() / p).saturating_sub(from / p);
                if want == 0 || kv.host_free.len() < want {
                    continue;
                }
                let at = kv.host_free.len() - want;
                let pages: Vec<u32> = kv.host_free.split_off(at);
                for (k, &hp) in pages.iter().enumerate() {
                    let t = from + k * p;
                    kv.host[hp as usize] = key[t..t + p].to_vec();
                }
                let got = e
                    .insert_host(anchor, &key[from..], &pages, &[])
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                // The caller frees what the tree did not keep.
                let freed = if got.dropped {
                    want
                } else {
                    got.prefix_len / p
                };
                kv.host_free.extend_from_slice(&pages[..freed]);
            }
            Op::HostLock(i, n) => {
                let Some(key) = pick(&i, n) else { continue };
                let m = kv.check(&mut e, &key)?;
                if let Some(best) = m.best {
                    let r = e
                        .host_lock(best.to_raw())
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    host_locks.extend(r);
                }
            }
            Op::HostUnlockAll => {
                for r in host_locks.drain(..) {
                    e.host_unlock(r)
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                }
            }
            Op::UnlockAll => {
                for lock in locks.drain(..) {
                    e.unlock(1, lock.to_raw())
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                }
            }
        }
        e.validate()
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        for key in &keys {
            kv.check(&mut e, key)?;
        }
        let stats = e.host_stats().expect("a host tier");
        prop_assert_eq!(stats.used as usize + kv.host_free.len(), HOST as usize);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Under each eviction policy, random inserts, write-throughs, device
    /// and host evictions, load-backs, L3 prefetches, locks and host locks:
    /// the engine stays valid (host leaves keyed as the policy says), and
    /// every page any match answers,
    /// device or host, holds the tokens at its place in the key (a host
    /// page freed and reused, or a promote filing the wrong pages, shows
    /// up as another key's tokens).
    #[test]
    fn every_page_a_match_answers_holds_its_tokens(
        policy in policy(),
        ops in prop::collection::vec(op(), 1..60),
    ) {
        run(policy, ops)?;
    }
}
