//! Eviction policies through a daemon (`radixd serve --eviction-policy`):
//! the daemon publishes its policy (clients and `radixd stat` read it),
//! inserts carry their hints over the wire (by anchor and in full, in a
//! namespace too) and the daemon evicts exactly what an in-process engine
//! with the same policy evicts; bad policies and parameters are refused
//! before anything is created; `radixd exec` takes the hints as JSON.

mod common;

use common::{radixd, Daemon, Exec};
use radixd::engine::{Config, Engine, InsertHints, Policy, Recency};
use radixd::Client;
use serde_json::json;

/// The daemon's flags and the policy they make.
fn configs() -> Vec<(Vec<&'static str>, Policy)> {
    let mut out: Vec<(Vec<&str>, Policy)> = Policy::NAMES
        .iter()
        .filter(|&&n| n != "tlru")
        .map(|&n| (vec!["--eviction-policy", n], n.parse().unwrap()))
        .collect();
    out.push((
        vec![
            "--eviction-policy",
            "tlru",
            "--eviction-policy-config",
            r#"{"threshold": 6, "next_prompt_estimate": 2}"#,
        ],
        Policy::Tlru {
            threshold: 6,
            next_prompt_estimate: 2,
        },
    ));
    out.push((
        vec![
            "--eviction-policy",
            "slru",
            "--eviction-policy-config",
            r#"{"protected_threshold": 1}"#,
        ],
        Policy::Slru {
            protected_threshold: 1,
        },
    ));
    out
}

/// A fixed mix of hinted inserts, locked matches and evictions over few
/// prefixes, run on `client` and on `engine` alike; every answer compared.
fn drive(client: &mut Client, engine: &mut Engine, anchoring: bool, ns: Option<&str>) {
    client.set_anchoring(anchoring);
    let mut x = 12345u64;
    let mut next = |n: u64| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) % n
    };
    let mut locks = Vec::new();
    for step in 0..400 {
        let len = 1 + next(6) as usize;
        let key: Vec<u32> = (0..len).map(|i| (i as u32) * 10 + next(3) as u32).collect();
        match next(10) {
            0..=4 => {
                let mut cached = Vec::new();
                engine.peek(&key, &mut cached);
                let need = (key.len() - cached.len()) as u64;
                let free = engine.stats().free_pages;
                if need > free {
                    let short = need - free;
                    assert_eq!(
                        client.evict(short).unwrap(),
                        engine.evict(short),
                        "step {step}"
                    );
                    engine.peek(&key, &mut cached);
                }
                let need = (key.len() - cached.len()) as u64;
                if need > engine.stats().free_pages {
                    continue;
                }
                if anchoring {
                    // A scheduler's match before its insert: the insert
                    // then goes by anchor, its hints with it.
                    let mut pages = Vec::new();
                    let want = engine.match_prefix(0, &key, false, &mut pages).len;
                    assert_eq!(client.match_prefix(&key, false).unwrap().len, want);
                }
                let fresh = engine.alloc(0, need).unwrap();
                let theirs = client.alloc(need).unwrap();
                assert_eq!(fresh, theirs, "step {step}: alloc");
                let pages: Vec<u32> = cached.iter().copied().chain(fresh).collect();
                let hints = InsertHints {
                    priority: next(5) as i64 - 2,
                    inserted_len: next(3) * 2,
                };
                let ours = match ns {
                    None => client.insert_hinted(&key, &pages, false, hints).unwrap(),
                    Some(ns) => client
                        .insert_hinted_in(ns, &key, &pages, false, hints)
                        .unwrap(),
                };
                let id = ns.map(|ns| engine.namespace(ns).unwrap());
                let want = match id {
                    None => engine.insert_hinted(0, &key, &pages, false, hints).unwrap(),
                    Some(id) => engine
                        .with_namespace(id, |e| e.insert_hinted(0, &key, &pages, false, hints))
                        .unwrap(),
                };
                assert_eq!(ours.cached, want.cached, "step {step}: insert");
            }
            5..=6 if ns.is_none() => {
                let lock = next(2) == 0;
                let ours = client.match_prefix(&key, lock).unwrap();
                let mut pages = Vec::new();
                let want = engine.match_prefix(0, &key, lock, &mut pages);
                assert_eq!(ours.len, want.len, "step {step}: match");
                if let (true, Some(a), Some(b)) = (lock, ours.handle, want.handle) {
                    locks.push((a, b));
                }
            }
            7 if !locks.is_empty() => {
                let (a, b) = locks.remove(next(locks.len() as u64) as usize);
                client.unlock(a).unwrap();
                engine.unlock(0, b.to_raw()).unwrap();
            }
            _ => {
                let n = 1 + next(5);
                assert_eq!(
                    client.evict(n).unwrap(),
                    engine.evict(n),
                    "step {step}: evict"
                );
            }
        }
        let (s, _) = client.stats().unwrap();
        let e = engine.stats();
        assert_eq!(
            (s.total_tokens, s.evictable_tokens, s.protected_tokens),
            (e.total_tokens, e.evictable_tokens, e.protected_tokens),
            "step {step}: sizes"
        );
    }
    client.validate().unwrap();
    assert!(engine.stats().evicted_pages > 50);
    assert_eq!(client.anchored_hits() > 0, anchoring);
}

#[test]
fn a_daemon_publishes_its_policy_and_evicts_as_an_engine_with_it() {
    for (flags, policy) in configs() {
        for (anchoring, ns) in [(true, None), (false, None), (false, Some("lora-1"))] {
            let mut args = vec![
                "--page-size",
                "1",
                "--capacity",
                "24",
                "--recency",
                "sglang",
            ];
            args.extend(&flags);
            let d = Daemon::start(&args);
            let mut client = Client::connect(&d.name).unwrap();
            assert_eq!(client.eviction_policy(), policy);
            assert_eq!(client.recency(), Recency::Sglang);
            let mut engine = Engine::new(Config {
                page_size: 1,
                capacity: 24,
            })
            .unwrap();
            engine.set_recency(Recency::Sglang);
            engine.set_policy(policy);
            drive(&mut client, &mut engine, anchoring, ns);
        }
    }
}

#[test]
fn stat_names_the_policy_and_lru_prints_as_before() {
    let d = Daemon::start(&[
        "--eviction-policy",
        "slru",
        "--eviction-policy-config",
        r#"{"protected_threshold": 3}"#,
    ]);
    let out = common::stat(&d.name);
    assert!(
        out.contains(r#", eviction policy slru {"protected_threshold": 3}"#),
        "{out}"
    );
    let plain = Daemon::start(&[]);
    let out = common::stat(&plain.name);
    assert!(!out.contains("eviction policy"), "{out}");
    assert_eq!(
        Client::connect(&plain.name).unwrap().eviction_policy(),
        Policy::Lru
    );
}

#[test]
fn bad_policies_are_refused_before_anything_is_created() {
    let cases: [(&[&str], &str); 6] = [
        (&["--eviction-policy", "arc"], "unknown eviction policy"),
        (
            &["--eviction-policy", "tlru"],
            "next_prompt_estimate < threshold",
        ),
        (
            &[
                "--eviction-policy",
                "slru",
                "--eviction-policy-config",
                r#"{"threshold": 2}"#,
            ],
            "protected_threshold",
        ),
        (
            &[
                "--eviction-policy",
                "lru",
                "--eviction-policy-config",
                r#"{"x": 1}"#,
            ],
            "takes no parameter",
        ),
        (
            &[
                "--eviction-policy",
                "slru",
                "--eviction-policy-config",
                "[1]",
            ],
            "not a JSON object",
        ),
        (
            &[
                "--eviction-policy",
                "slru",
                "--eviction-policy-config",
                r#"{"protected_threshold": 1.5}"#,
            ],
            "not an integer",
        ),
    ];
    for (args, says) in cases {
        let name = format!("radixd-policy-refused-{}", std::process::id());
        let out = radixd()
            .args(["serve", "--name", &name])
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!std::path::Path::new(&format!("/dev/shm/{name}")).exists());
    }
    // The config alone names no policy.
    let out = radixd()
        .args(["serve", "--eviction-policy-config", "{}"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn exec_takes_hints_and_the_policy_flag() {
    let mut e = Exec::start(&[
        "--page-size",
        "1",
        "--capacity",
        "4",
        "--eviction-policy",
        "priority",
    ]);
    let pages = |r: serde_json::Value| r["pages"].clone();
    for (key, prio) in [([1, 1], 5), ([2, 2], 0)] {
        let p = pages(e.call(json!({"op": "alloc", "n": 2})));
        let r = e.call(json!({"op": "insert", "tokens": key, "pages": p, "priority": prio}));
        assert_eq!(r["ok"], true, "{r}");
    }
    // [1, 1] is the older, but its priority keeps it: [2, 2] goes.
    assert_eq!(e.call(json!({"op": "evict", "tokens": 2}))["evicted"], 2);
    assert_eq!(e.call(json!({"op": "match", "tokens": [1, 1]}))["len"], 2);
    assert_eq!(e.call(json!({"op": "match", "tokens": [2, 2]}))["len"], 0);
    let r = e.call(json!({"op": "insert", "tokens": [3], "pages": [], "priority": "x"}));
    assert_eq!(r["error"], "malformed", "{r}");
    // Through a daemon the policy is the daemon's.
    let d = Daemon::start(&[]);
    let out = radixd()
        .args(["exec", "--connect", &d.name, "--eviction-policy", "lfu"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--eviction-policy is the daemon's"));
}
