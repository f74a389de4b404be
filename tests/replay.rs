//! End-to-end tests of `radixd replay` through its public API: hand-computed
//! traces per policy, error cases, identities on the real trace, the plot.
//!
//! Every expected number is derived by hand in the comment next to it.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Parser;
use radixd::replay::{
    make_policy, parse_trace, replay, run, small_queue_capacity, ReplayArgs, ReplayError,
    RequestOutcome, Summary, PLOT_TITLE,
};

const CONVERSATION: &str = "/work/shared/traces/conversation_trace.jsonl";
const SYNTHETIC: &str = "/work/shared/traces/synthetic_trace.jsonl";

#[derive(Parser, Debug)]
struct Cli {
    #[command(flatten)]
    args: ReplayArgs,
}

/// A fresh scratch directory per test.
fn scratch(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("replay")
        .join(test);
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes a trace of `(input_length, hash_ids)` requests.
fn write_trace(dir: &Path, requests: &[(u64, &[u64])]) -> PathBuf {
    let mut text = String::new();
    for (i, (len, ids)) in requests.iter().enumerate() {
        let ids: Vec<String> = ids.iter().map(u64::to_string).collect();
        text.push_str(&format!(
            "{{\"timestamp\": {i}, \"input_length\": {len}, \"output_length\": 1, \"hash_ids\": [{}]}}\n",
            ids.join(", ")
        ));
    }
    let path = dir.join("trace.jsonl");
    fs::write(&path, text).unwrap();
    path
}

fn args(cmdline: &[&str]) -> ReplayArgs {
    let mut argv = vec!["replay"];
    argv.extend_from_slice(cmdline);
    Cli::try_parse_from(argv).unwrap().args
}

/// Runs and returns the summary lines.
fn run_ok(args: &ReplayArgs) -> Vec<Summary> {
    let mut out = Vec::new();
    run(args, &mut out).unwrap();
    String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn run_err(args: &ReplayArgs) -> ReplayError {
    let mut out = Vec::new();
    run(args, &mut out).unwrap_err()
}

fn one(trace: &Path, policy: &str, capacity: usize) -> Summary {
    let cap = capacity.to_string();
    let t = trace.to_str().unwrap();
    let mut s = run_ok(&args(&[t, "--policy", policy, "--capacity", &cap]));
    assert_eq!(s.len(), 1);
    s.remove(0)
}

fn per_request(trace: &Path, policy: &str, capacity: usize) -> (Summary, Vec<RequestOutcome>) {
    let file = trace.with_extension("per_request.jsonl");
    let cap = capacity.to_string();
    let a = args(&[
        trace.to_str().unwrap(),
        "--policy",
        policy,
        "--capacity",
        &cap,
        "--per-request",
        file.to_str().unwrap(),
    ]);
    let mut s = run_ok(&a);
    let lines = fs::read_to_string(&file).unwrap();
    let outcomes = lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (s.remove(0), outcomes)
}

fn hit_blocks(outcomes: &[RequestOutcome]) -> Vec<u64> {
    outcomes.iter().map(|o| o.hit_blocks).collect()
}

fn hit_tokens(outcomes: &[RequestOutcome]) -> Vec<u64> {
    outcomes.iter().map(|o| o.hit_tokens).collect()
}

/// The totals of a run worked out by hand: prompt tokens, hit tokens,
/// blocks, hit blocks, and blocks resident at the end.
struct Totals {
    prompt_tokens: u64,
    hit_tokens: u64,
    blocks: u64,
    hit_blocks: u64,
    final_cache_blocks: usize,
}

fn assert_totals(s: &Summary, t: Totals) {
    assert_eq!(s.total_prompt_tokens, t.prompt_tokens);
    assert_eq!(s.total_hit_tokens, t.hit_tokens);
    assert_eq!(s.total_blocks, t.blocks);
    assert_eq!(s.hit_blocks, t.hit_blocks);
    assert_eq!(s.final_cache_blocks, t.final_cache_blocks);
}

#[test]
fn cli_flags_parse_with_defaults() {
    let a = args(&[
        "t.jsonl",
        "--policy",
        "lru,lfu,s3fifo,radix",
        "--capacity",
        "1000,10000",
    ]);
    assert_eq!(a.trace, PathBuf::from("t.jsonl"));
    assert_eq!(a.policy, ["lru", "lfu", "s3fifo", "radix"]);
    assert_eq!(a.capacity, [1000, 10000]);
    assert_eq!(a.block_size, 512);
    assert!(a.per_request.is_none() && a.plot.is_none());
    let a = args(&[
        "t",
        "--policy",
        "lru",
        "--capacity",
        "7",
        "--block-size",
        "16",
        "--per-request",
        "p",
        "--plot",
        "x.svg",
    ]);
    assert_eq!(a.block_size, 16);
    assert_eq!(a.per_request, Some(PathBuf::from("p")));
    assert_eq!(a.plot, Some(PathBuf::from("x.svg")));
}

#[test]
fn output_fields_in_order() {
    let dir = scratch("fields");
    let trace = write_trace(&dir, &[(10, &[1])]);
    let mut out = Vec::new();
    run(
        &args(&[
            trace.to_str().unwrap(),
            "--policy",
            "lru",
            "--capacity",
            "4",
        ]),
        &mut out,
    )
    .unwrap();
    // One cold request of 10 tokens, 1 block: nothing hits, 1 block stays.
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "{\"policy\":\"lru\",\"capacity_blocks\":4,\"block_size\":512,\"requests\":1,\
         \"total_prompt_tokens\":10,\"total_hit_tokens\":0,\"overall_hit_rate\":0.0,\
         \"total_blocks\":1,\"hit_blocks\":0,\"final_cache_blocks\":1}\n"
    );
}

#[test]
fn one_line_per_policy_and_capacity_policy_major() {
    let dir = scratch("grid");
    let trace = write_trace(&dir, &[(10, &[1])]);
    let s = run_ok(&args(&[
        trace.to_str().unwrap(),
        "--policy",
        "lru,lfu,s3fifo",
        "--capacity",
        "6,60",
    ]));
    let keys: Vec<(&str, usize)> = s
        .iter()
        .map(|s| (s.policy.as_str(), s.capacity_blocks))
        .collect();
    assert_eq!(
        keys,
        [
            ("lru", 6),
            ("lru", 60),
            ("lfu", 6),
            ("lfu", 60),
            ("s3fifo", 6),
            ("s3fifo", 60)
        ]
    );
}

/// Shared by the LRU and LFU tests: (input_length, hash_ids).
const FLAT_TRACE: [(u64, &[u64]); 5] = [
    (1200, &[1, 2, 3]),
    (1100, &[1, 2, 3]),
    (2000, &[1, 2, 4, 5]),
    (600, &[1, 2]),
    (1024, &[5, 1]),
];

#[test]
fn lru_by_hand() {
    let dir = scratch("lru");
    let trace = write_trace(&dir, &FLAT_TRACE);
    let (s, per) = per_request(&trace, "lru", 3);
    // Capacity 3, recency shown least → most recent.
    // R0 [1,2,3]: cold, k=0 → [1,2,3].
    // R1 [1,2,3]: k=3; 3*512=1536 capped at L=1100.
    // R2 [1,2,4,5]: k=2 (4 misses) → 1024. 1,2 → [3,1,2]; 4 evicts 3; 5 evicts
    //    1, a block of this very request → [2,4,5].
    // R3 [1,2]: 1 gone, k=0. 1 evicts 2, 2 evicts 4 → [5,1,2].
    // R4 [5,1]: k=2 → min(1024, 1024) = 1024.
    assert_eq!(hit_blocks(&per), [0, 3, 2, 0, 2]);
    assert_eq!(hit_tokens(&per), [0, 1100, 1024, 0, 1024]);
    assert_eq!(per[1].prompt_tokens, 1100);
    assert_eq!(
        per.iter().map(|o| o.index).collect::<Vec<_>>(),
        [0, 1, 2, 3, 4]
    );
    // 1200+1100+2000+600+1024 = 5924; 1100+1024+1024 = 3148; 3+3+4+2+2 = 14.
    assert_eq!(s.requests, 5);
    assert_eq!(s.total_prompt_tokens, 5924);
    assert_eq!(s.total_hit_tokens, 3148);
    assert_eq!(s.overall_hit_rate, 3148.0 / 5924.0);
    assert_eq!(s.total_blocks, 14);
    assert_eq!(s.hit_blocks, 7);
    assert_eq!(s.final_cache_blocks, 3);
}

#[test]
fn radix_by_hand_keeps_the_current_path_and_evicts_leaves() {
    let dir = scratch("radix");
    let trace = write_trace(
        &dir,
        &[
            (1024, &[1, 2]),
            (512, &[3]),
            (1536, &[1, 2, 4]),
            (512, &[3]),
            (1300, &[1, 2, 4]),
        ],
    );
    let (summary, outcomes) = per_request(&trace, "radix", 3);
    // 1: miss, cache 1-2. 2: miss, cache 1-2, 3 (full).
    // 3: 1-2 hit and are locked; 4 evicts the only other leaf, 3.
    // 4: 3 misses and evicts the LRU unlocked leaf, 4 (1-2 is not a leaf).
    // 5: 1-2 hit again (flat LRU would have evicted 1 at step 4), 4 misses;
    //    hit tokens are min(2 * 512, 1300) = 1024.
    assert_eq!(hit_blocks(&outcomes), vec![0, 0, 2, 0, 2]);
    assert_eq!(outcomes[4].hit_tokens, 1024);
    assert_eq!((summary.hit_blocks, summary.total_hit_tokens), (4, 2048));
    assert_eq!(summary.final_cache_blocks, 3);
    // The same trace under flat LRU loses block 1 at step 4.
    let (_, lru) = per_request(&trace, "lru", 3);
    assert_eq!(hit_blocks(&lru), vec![0, 0, 2, 0, 0]);
}

#[test]
fn lfu_by_hand() {
    let dir = scratch("lfu");
    let trace = write_trace(&dir, &FLAT_TRACE);
    let (s, per) = per_request(&trace, "lfu", 3);
    // Capacity 3, counts as id:count.
    // R0 [1,2,3]: cold → 1:1 2:1 3:1.
    // R1 [1,2,3]: k=3, capped at 1100 → 1:2 2:2 3:2.
    // R2 [1,2,4,5]: k=2 → 1024. 1:3 2:3; 4 evicts the lowest count, 3:2;
    //    5 evicts 4:1 (lowest) → 1:3 2:3 5:1.
    // R3 [1,2]: k=2, 1024 capped at L=600 → 1:4 2:4.
    // R4 [5,1]: k=2 → 1024.
    assert_eq!(hit_blocks(&per), [0, 3, 2, 2, 2]);
    assert_eq!(hit_tokens(&per), [0, 1100, 1024, 600, 1024]);
    // 1100+1024+600+1024 = 3748; 3+2+2+2 = 9.
    assert_totals(
        &s,
        Totals {
            prompt_tokens: 5924,
            hit_tokens: 3748,
            blocks: 14,
            hit_blocks: 9,
            final_cache_blocks: 3,
        },
    );
}

#[test]
fn lfu_ties_broken_by_least_recent_access() {
    let dir = scratch("lfu_tie");
    // Capacity 2. R0 [1,2]: 1:1 2:1. R1 [2,1]: both hit, 2:2 then 1:2, so 2
    // is the less recently accessed. R2 [3]: evicts 2 → {1, 3}.
    // R3 [1,2]: 1 hits, 2 missed → k=1.
    let trace = write_trace(
        &dir,
        &[
            (1024, &[1, 2]),
            (1024, &[2, 1]),
            (512, &[3]),
            (1024, &[1, 2]),
        ],
    );
    let (_, per) = per_request(&trace, "lfu", 2);
    assert_eq!(hit_blocks(&per), [0, 2, 0, 1]);
}

#[test]
fn s3fifo_promotion_and_ghost_by_hand() {
    let dir = scratch("s3fifo");
    let trace = write_trace(
        &dir,
        &[
            (1024, &[1, 2]),
            (1000, &[2, 1]),
            (1536, &[1, 2, 3]),
            (1400, &[1, 2, 3]),
            (10, &[4]),
        ],
    );
    let (s, per) = per_request(&trace, "s3fifo", 6);
    // Capacity 6: small_cap = round(0.6) = 1, main_cap = 5, ghost_cap = 5.
    // R0 [1,2]: k=0. 1 → S=[1:0]; 2 pushes 1 (freq 0) to G → S=[2:0], G=[1].
    // R1 [2,1]: 2 resident, 1 only a ghost → k=1 → 512. 2 → freq 1; 1 leaves
    //    G for M at freq 0 → S=[2:1], M=[1:0].
    // R2 [1,2,3]: k=2 → 1024. 1:1, 2:2; 3 pushes 2 (freq 2) into M keeping
    //    freq 2 → S=[3:0], M=[1:1, 2:2].
    // R3 [1,2,3]: k=3, 1536 capped at 1400. 1:2, 2:3, 3:1.
    // R4 [4]: k=0. 4 pushes 3 (freq 1) into M → S=[4], M=[1, 2, 3].
    assert_eq!(hit_blocks(&per), [0, 1, 2, 3, 0]);
    assert_eq!(hit_tokens(&per), [0, 512, 1024, 1400, 0]);
    // 1024+1000+1536+1400+10 = 4970; 512+1024+1400 = 2936; 2+2+3+3+1 = 11.
    assert_totals(
        &s,
        Totals {
            prompt_tokens: 4970,
            hit_tokens: 2936,
            blocks: 11,
            hit_blocks: 6,
            // |S| + |M| = 1 + 3.
            final_cache_blocks: 4,
        },
    );
}

#[test]
fn s3fifo_second_chance_in_main() {
    let dir = scratch("s3fifo_second_chance");
    let mut reqs: Vec<(u64, &[u64])> = vec![(512, &[10]); 5];
    reqs.extend_from_slice(&[
        (512, &[11]),
        (512, &[12]),
        (512, &[11]),
        (512, &[13]),
        (512, &[12]),
        (512, &[14]),
        (512, &[13]),
        (512, &[15]),
        (512, &[14]),
        (512, &[16]),
        (512, &[15]),
        (1024, &[10, 11]),
    ]);
    let trace = write_trace(&dir, &reqs);
    let (s, per) = per_request(&trace, "s3fifo", 6);
    // Capacity 6: S 1, M 5, G 5.
    // [10]×5: k = 0,1,1,1,1; freq 0→1→2→3→3 (saturates).
    // [11]: 10 (freq 3) promoted → M=[10:3], S=[11].
    // [12],[11] / [13],[12] / [14],[13] / [15],[14]: each new id pushes the
    //    S head to G, then that id comes back from G into M at freq 0; all
    //    k=0 → M=[10:3, 11, 12, 13, 14] (full), S=[15].
    // [16]: 15 → G. [15]: back from G, M full: head 10 (freq 3) requeued at
    //    2, head 11 (freq 0) evicted to G → M=[12,13,14,10:2,15].
    // [10,11]: 10 survived thanks to its second chance, 11 is a ghost → k=1.
    // A FIFO M without second chance would have evicted 10 → k=0.
    let mut expected = vec![0, 1, 1, 1, 1];
    expected.extend_from_slice(&[0; 11]);
    expected.push(1);
    assert_eq!(hit_blocks(&per), expected);
    // 5 hits of 512 tokens.
    assert_eq!(s.total_hit_tokens, 5 * 512);
    // S=[16] plus M's 5.
    assert_eq!(s.final_cache_blocks, 6);
}

#[test]
fn s3fifo_small_queue_rounds_half_to_even() {
    // Capacity 15: 1.5 → 2. [1],[2] fill S=[1,2]; [1] still in S → k=1.
    // (With S of 1, 2 would push 1 to G and the probe would miss.)
    let dir = scratch("round15");
    let trace = write_trace(&dir, &[(512, &[1]), (512, &[2]), (512, &[1])]);
    assert_eq!(one(&trace, "s3fifo", 15).hit_blocks, 1);
    // Capacity 25: 2.5 → 2 (not 3). [1],[2],[3]: 3 pushes 1 (freq 0) to G,
    // so the probe [1] misses → k=0. With S of 3 it would hit.
    let dir = scratch("round25");
    let trace = write_trace(&dir, &[(512, &[1]), (512, &[2]), (512, &[3]), (512, &[1])]);
    assert_eq!(one(&trace, "s3fifo", 25).hit_blocks, 0);
    // Capacity 35: 3.5 → 4 (not 3). [1]..[4] fit in S, probe [1] hits → 1.
    let dir = scratch("round35");
    let trace = write_trace(
        &dir,
        &[
            (512, &[1]),
            (512, &[2]),
            (512, &[3]),
            (512, &[4]),
            (512, &[1]),
        ],
    );
    assert_eq!(one(&trace, "s3fifo", 35).hit_blocks, 1);
    // The helper agrees: 2.5 → 2, 3.5 → 4, 1.5 → 2, 0.5 → 0.
    assert_eq!([25, 35, 15, 5].map(small_queue_capacity), [2, 4, 2, 0]);
}

#[test]
fn s3fifo_small_queue_below_one_block_is_an_error() {
    let dir = scratch("small_cap_zero");
    let trace = write_trace(&dir, &[(512, &[1])]);
    // 5 * 0.1 = 0.5 rounds (half to even) to 0.
    let err = run_err(&args(&[
        trace.to_str().unwrap(),
        "--policy",
        "s3fifo",
        "--capacity",
        "5",
    ]));
    assert!(matches!(
        err,
        ReplayError::SmallQueueTooSmall {
            capacity: 5,
            small_cap: 0
        }
    ));
    assert!(err.to_string().contains("small queue"), "{err}");
    // LRU is happy with 5.
    assert_eq!(one(&trace, "lru", 5).final_cache_blocks, 1);
}

#[test]
fn capacity_zero_is_an_error() {
    let dir = scratch("cap0");
    let trace = write_trace(&dir, &[(512, &[1])]);
    for policy in ["lru", "lfu", "s3fifo"] {
        let err = run_err(&args(&[
            trace.to_str().unwrap(),
            "--policy",
            policy,
            "--capacity",
            "10,0",
        ]));
        assert!(
            matches!(err, ReplayError::ZeroCapacity),
            "{policy}: {err:?}"
        );
        assert!(err.to_string().contains("capacity"));
    }
}

#[test]
fn unknown_policies_are_errors() {
    let dir = scratch("unknown");
    let trace = write_trace(&dir, &[(512, &[1])]);
    let t = trace.to_str().unwrap();
    let err = run_err(&args(&[t, "--policy", "lru,arc", "--capacity", "10"]));
    assert!(matches!(&err, ReplayError::UnknownPolicy { name } if name == "arc"));
    assert!(err.to_string().contains("arc"));
    // Errors come before any output: nothing printed for lru either.
    let mut out = Vec::new();
    assert!(run(
        &args(&[t, "--policy", "lru,arc", "--capacity", "10"]),
        &mut out
    )
    .is_err());
    assert!(out.is_empty());
}

#[test]
fn malformed_line_error_names_its_line_number() {
    let dir = scratch("malformed");
    let path = dir.join("bad.jsonl");
    fs::write(
        &path,
        "{\"timestamp\": 0, \"input_length\": 512, \"output_length\": 1, \"hash_ids\": [1]}\n\
         {\"timestamp\": 0, \"input_length\": 512, \"output_length\": 1, \"hash_ids\": [2]}\n\
         {\"timestamp\": 0, \"input_length\": \"many\", \"output_length\": 1, \"hash_ids\": [3]}\n",
    )
    .unwrap();
    let err = run_err(&args(&[
        path.to_str().unwrap(),
        "--policy",
        "lru",
        "--capacity",
        "10",
    ]));
    // Third line: input_length is a string.
    assert!(matches!(err, ReplayError::Parse { line: 3, .. }), "{err:?}");
    assert!(err.to_string().contains("line 3"), "{err}");
    // Not JSON at all, on line 1.
    fs::write(&path, "hello\n").unwrap();
    let err = run_err(&args(&[
        path.to_str().unwrap(),
        "--policy",
        "lru",
        "--capacity",
        "10",
    ]));
    assert!(matches!(err, ReplayError::Parse { line: 1, .. }), "{err:?}");
    // A negative block id is not a u64, on line 2.
    let text = "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n\
                {\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [-1]}\n";
    let err = parse_trace(text.as_bytes(), "inline").unwrap_err();
    assert!(matches!(err, ReplayError::Parse { line: 2, .. }), "{err:?}");
}

#[test]
fn missing_trace_is_an_io_error() {
    let dir = scratch("missing");
    let path = dir.join("nope.jsonl");
    let err = run_err(&args(&[
        path.to_str().unwrap(),
        "--policy",
        "lru",
        "--capacity",
        "10",
    ]));
    assert!(matches!(err, ReplayError::Io { .. }), "{err:?}");
    assert!(err.to_string().contains("nope.jsonl"));
}

#[test]
fn per_request_needs_one_policy_and_one_capacity() {
    let dir = scratch("per_request_single");
    let trace = write_trace(&dir, &[(512, &[1])]);
    let t = trace.to_str().unwrap();
    let p = dir.join("p.jsonl");
    for (policies, capacities) in [("lru,lfu", "10"), ("lru", "10,20")] {
        let err = run_err(&args(&[
            t,
            "--policy",
            policies,
            "--capacity",
            capacities,
            "--per-request",
            p.to_str().unwrap(),
        ]));
        assert!(
            matches!(err, ReplayError::PerRequestNeedsSingleRun { .. }),
            "{err:?}"
        );
    }
}

#[test]
fn empty_trace_has_zero_hit_rate() {
    let dir = scratch("empty");
    let path = dir.join("empty.jsonl");
    fs::write(&path, "\n\n").unwrap();
    let s = one(&path, "lru", 10);
    // No requests: every total is 0 and the rate is defined as 0.
    assert_eq!(
        (
            s.requests,
            s.total_prompt_tokens,
            s.overall_hit_rate,
            s.final_cache_blocks
        ),
        (0, 0, 0.0, 0)
    );
}

#[test]
fn block_size_scales_hit_tokens() {
    let dir = scratch("block_size");
    // Block size 100: R1 hits both blocks → min(2*100, 150) = 150 tokens.
    let trace = write_trace(&dir, &[(150, &[1, 2]), (150, &[1, 2])]);
    let s = run_ok(&args(&[
        trace.to_str().unwrap(),
        "--policy",
        "lru",
        "--capacity",
        "8",
        "--block-size",
        "100",
    ]));
    assert_eq!(
        (s[0].block_size, s[0].total_hit_tokens, s[0].hit_blocks),
        (100, 150, 2)
    );
}

/// The first `n` lines of the conversation trace, in a scratch file.
fn real_slice(dir: &Path, n: usize) -> PathBuf {
    let text = fs::read_to_string(CONVERSATION).unwrap();
    let head: String = text.lines().take(n).flat_map(|l| [l, "\n"]).collect();
    let path = dir.join("slice.jsonl");
    fs::write(&path, head).unwrap();
    path
}

#[test]
fn identities_on_a_real_trace_slice() {
    let dir = scratch("identities");
    let trace = real_slice(&dir, 2000);
    for policy in ["lru", "lfu", "s3fifo"] {
        for capacity in [50, 1000, 20000] {
            let (s, per) = per_request(&trace, policy, capacity);
            assert_eq!(s.requests, 2000);
            assert_eq!(per.len(), 2000);
            assert_eq!(
                per.iter().map(|o| o.prompt_tokens).sum::<u64>(),
                s.total_prompt_tokens
            );
            assert_eq!(
                per.iter().map(|o| o.hit_tokens).sum::<u64>(),
                s.total_hit_tokens
            );
            assert_eq!(per.iter().map(|o| o.hit_blocks).sum::<u64>(), s.hit_blocks);
            assert!(s.final_cache_blocks <= capacity);
            assert!(s.hit_blocks <= s.total_blocks);
            for o in &per {
                assert!(o.hit_tokens <= o.prompt_tokens);
                assert!(o.hit_tokens <= o.hit_blocks * 512);
            }
            let rate = s.total_hit_tokens as f64 / s.total_prompt_tokens as f64;
            assert_eq!(s.overall_hit_rate, rate);
        }
    }
}

#[test]
fn whole_trace_totals_match_the_readme() {
    let s = one(Path::new(CONVERSATION), "lru", 1000);
    // traces/README.md: 12,031 requests, 144,793,823 input tokens; the task
    // brief: 288,500 block accesses.
    assert_eq!(s.requests, 12_031);
    assert_eq!(s.total_prompt_tokens, 144_793_823);
    assert_eq!(s.total_blocks, 288_500);
    // The cache fills: far more distinct blocks (182,790) than capacity.
    assert_eq!(s.final_cache_blocks, 1000);
}

#[test]
fn plot_svg_has_title_axes_and_every_policy() {
    let dir = scratch("plot");
    let trace = real_slice(&dir, 500);
    let svg = dir.join("hit_rate.svg");
    let a = args(&[
        trace.to_str().unwrap(),
        "--policy",
        "lru,lfu,s3fifo",
        "--capacity",
        "100,1000,10000",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(run_ok(&a).len(), 9);
    let text = fs::read_to_string(&svg).unwrap();
    assert!(text.contains("<svg"));
    assert!(text.contains(PLOT_TITLE));
    assert!(text.contains("slice.jsonl"));
    assert!(text.contains("log scale"));
    assert!(text.contains("hit rate"));
    for policy in ["lru", "lfu", "s3fifo"] {
        // plotters puts each text on a line of its own.
        assert!(
            text.lines().any(|l| l.trim() == policy),
            "{policy} missing from legend"
        );
    }
    // Capacities spanning < 10× use a linear axis; a single capacity works.
    for caps in ["100,200", "300"] {
        let a = args(&[
            trace.to_str().unwrap(),
            "--policy",
            "lru,s3fifo",
            "--capacity",
            caps,
            "--plot",
            svg.to_str().unwrap(),
        ]);
        run_ok(&a);
        let text = fs::read_to_string(&svg).unwrap();
        assert!(text.contains(PLOT_TITLE) && !text.contains("log scale"));
    }
}

/// Throughput and hit-rate table; run in release:
/// `cargo test --release --test replay -- --ignored --nocapture`.
#[test]
#[ignore]
fn bench_flat_policies_on_real_traces() {
    for path in [CONVERSATION, SYNTHETIC] {
        let t0 = Instant::now();
        let text = fs::read(path).unwrap();
        let requests = parse_trace(text.as_slice(), path).unwrap();
        let parse = t0.elapsed();
        let blocks: usize = requests.iter().map(|r| r.hash_ids.len()).sum();
        println!(
            "{path}: {} requests, {blocks} blocks, parse {parse:?}",
            requests.len()
        );
        for policy in ["lru", "lfu", "s3fifo"] {
            for capacity in [1000, 10_000, 50_000] {
                let mut p = make_policy(policy, capacity).unwrap();
                let t = Instant::now();
                let s = replay(&requests, p.as_mut(), capacity, 512);
                let dt = t.elapsed();
                println!(
                    "  {policy:>6} cap {capacity:>6}: hit rate {:.4}  hit tokens {:>9}  \
                     hit blocks {:>7}  final {:>6}  replay {dt:?}  {:.1} M blocks/s",
                    s.overall_hit_rate,
                    s.total_hit_tokens,
                    s.hit_blocks,
                    s.final_cache_blocks,
                    blocks as f64 / dt.as_secs_f64() / 1e6
                );
            }
        }
    }
}

#[test]
fn the_cli_exits_2_naming_the_bad_line() {
    let dir = scratch("cli");
    let path = dir.join("bad.jsonl");
    fs::write(
        &path,
        "{\"timestamp\":0,\"input_length\":5,\"output_length\":1,\"hash_ids\":[1]}\n{oops\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_radixd"))
        .args([
            "replay",
            path.to_str().unwrap(),
            "--policy",
            "lru,radix",
            "--capacity",
            "10",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("line 2"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.is_empty());
}

/// `--policy store` runs the store's real index (reserve, commit, reader
/// stamps, leaf-first eviction): on both Mooncake traces it hits exactly
/// as often as exact LRU with leaf-first eviction (`lru-leaf`), request by
/// request (docs/store.md; goal: at least 0.98 of it).
#[test]
fn the_store_policy_matches_exact_lru_with_leaf_first_eviction() {
    for (trace, capacity) in [(SYNTHETIC, 2000), (CONVERSATION, 4000)] {
        let (store, per_store) = per_request(Path::new(trace), "store", capacity);
        let (reference, per_ref) = per_request(Path::new(trace), "lru-leaf", capacity);
        assert!(store.hit_blocks > 0, "{trace}: no hits at all");
        assert_eq!(store.hit_blocks, reference.hit_blocks, "{trace}");
        assert_eq!(store.final_cache_blocks, capacity);
        assert!(per_store == per_ref, "{trace}: requests differ");
    }
}
