//! Unit tests of the index: Dynamo's semantics, case by case.

use super::*;

fn idx() -> KvIndex {
    KvIndex::new(IndexConfig::xxh3(2)).expect("index")
}

const A: Worker = Worker { id: 1, dp_rank: 0 };
const B: Worker = Worker { id: 2, dp_rank: 0 };
const C: Worker = Worker { id: 3, dp_rank: 1 };

/// The worker-side names of blocks: their XXH3 chain over `tokens`
/// (block size 2), as a radixd daemon publishes them.
fn names(tokens: &[u32]) -> Vec<u64> {
    Scheme::Xxh3.prompt(tokens, 2)
}

fn stored(i: &KvIndex, w: Worker, parent: Option<u64>, hashes: &[u64], tokens: &[u32]) {
    i.apply_event(
        w,
        &KvEvent::BlockStored {
            block_hashes: hashes.to_vec(),
            parent_block_hash: parent,
            token_ids: tokens.to_vec(),
            block_size: 2,
            lora_id: None,
            medium: Some("GPU".into()),
        },
    )
    .expect("store");
}

fn sorted(mut s: OverlapScores) -> Vec<(Worker, u32)> {
    s.scores.sort_unstable();
    s.scores
}

#[test]
fn scores_count_leading_blocks_per_worker() {
    let i = idx();
    let t: Vec<u32> = (1..=8).collect();
    let h = names(&t);
    stored(&i, A, None, &h, &t);
    stored(&i, B, None, &h[..2], &t[..4]);
    stored(&i, C, None, &h[..1], &t[..2]);
    let s = i.find_matches_for_tokens(&t, false);
    assert_eq!(sorted(s.clone()), vec![(A, 4), (B, 2), (C, 1)]);
    assert_eq!(s.tree_size(A), Some(4));
    assert_eq!(s.tree_size(B), Some(2));
    // A different first block: nobody scores, everyone keeps a tree size.
    let s = i.find_matches_for_tokens(&[9, 9, 1, 2], false);
    assert!(s.scores.is_empty());
    assert_eq!(s.tree_sizes.len(), 3);
    // A partial last block is not a block.
    assert_eq!(
        sorted(i.find_matches_for_tokens(&t[..3], false)),
        vec![(A, 1), (B, 1), (C, 1)]
    );
    assert!(i.find_matches(&[], false).scores.is_empty());
}

#[test]
fn a_child_under_a_parent_and_a_different_branch() {
    let i = idx();
    let t = [1, 2, 3, 4, 5, 6];
    let h = names(&t);
    stored(&i, A, None, &h[..1], &t[..2]);
    // The rest, hung under the parent by the worker's hash of it.
    stored(&i, A, Some(h[0]), &h[1..], &t[2..]);
    assert_eq!(sorted(i.find_matches_for_tokens(&t, false)), vec![(A, 3)]);
    // The same tokens after another first block are other blocks.
    let u = [7, 7, 3, 4, 5, 6];
    assert_eq!(sorted(i.find_matches_for_tokens(&u, false)), vec![]);
}

#[test]
fn unknown_parent_is_skipped_and_changes_nothing() {
    let i = idx();
    let e = i.store_tokens(A, Some(42), &[5], &[1, 2], 2);
    assert_eq!(e, Err(ApplyError::ParentNotFound));
    assert!(i.find_matches_for_tokens(&[1, 2], false).scores.is_empty());
    // As in Dynamo, the worker is known (tree size 0) after any event.
    assert_eq!(i.workers(), vec![(A, 0)]);
    assert_eq!(i.stats().errors[ApplyError::ParentNotFound.index()], 1);
}

#[test]
fn duplicates_and_self_references() {
    let i = idx();
    let t = [1, 2, 3, 4];
    let h = names(&t);
    stored(&i, A, None, &h, &t);
    // Storing again changes nothing.
    stored(&i, A, None, &h, &t);
    assert_eq!(i.workers(), vec![(A, 2)]);
    assert_eq!(i.stats().blocks, 2);
    // A hash twice, or the parent among the blocks: refused whole.
    assert_eq!(
        i.store_tokens(B, None, &[9, 9], &t, 2),
        Err(ApplyError::InvalidBlockSequence)
    );
    assert_eq!(
        i.store_tokens(A, Some(h[0]), &[h[0]], &[5, 6], 2),
        Err(ApplyError::InvalidBlockSequence)
    );
    let many: Vec<u64> = (0..40).chain([7]).collect();
    let toks = vec![1; 82];
    assert_eq!(
        i.store_tokens(B, None, &many, &toks, 2),
        Err(ApplyError::InvalidBlockSequence)
    );
    assert_eq!(sorted(i.find_matches_for_tokens(&t, false)), vec![(A, 2)]);
}

#[test]
fn wrong_block_size_and_short_tokens_change_nothing() {
    let i = idx();
    assert_eq!(
        i.store_tokens(A, None, &[1], &[1, 2, 3], 3),
        Err(ApplyError::BlockSize { got: 3, want: 2 })
    );
    assert_eq!(
        i.store_tokens(A, None, &[1, 2], &[1, 2, 3], 2),
        Err(ApplyError::TokensShort)
    );
    assert_eq!(i.stats().blocks, 0);
    assert_eq!(i.workers(), vec![(A, 0)]);
}

#[test]
fn removal_of_unknown_blocks_goes_on_with_the_rest() {
    let i = idx();
    let t = [1, 2, 3, 4, 5, 6];
    let h = names(&t);
    stored(&i, A, None, &h, &t);
    stored(&i, B, None, &h, &t);
    assert_eq!(i.remove(A, &[h[2], 999]), Err(ApplyError::BlockNotFound));
    assert_eq!(
        sorted(i.find_matches_for_tokens(&t, false)),
        vec![(A, 2), (B, 3)]
    );
    // Removing a middle block: the worker's score stops before it; its
    // later block stays held (tree size), as a child does in Dynamo.
    i.remove(B, &[h[1]]).expect("remove");
    assert_eq!(
        sorted(i.find_matches_for_tokens(&t, false)),
        vec![(A, 2), (B, 1)]
    );
    assert_eq!(i.workers(), vec![(A, 2), (B, 2)]);
    // Re-storing the missing block under its parent restores the chain.
    stored(&i, B, Some(h[0]), &h[1..2], &t[2..4]);
    assert_eq!(
        sorted(i.find_matches_for_tokens(&t, false)),
        vec![(A, 2), (B, 3)]
    );
    // A removal for a worker never seen: an error, nothing else.
    assert_eq!(i.remove(C, &[h[0]]), Err(ApplyError::BlockNotFound));
    assert_eq!(
        sorted(i.find_matches_for_tokens(&t, false)),
        vec![(A, 2), (B, 3)]
    );
}

#[test]
fn clear_remove_worker_and_all_blocks_cleared() {
    let i = idx();
    let t = [1, 2, 3, 4];
    let h = names(&t);
    for w in [A, B, C] {
        stored(&i, w, None, &h, &t);
    }
    i.clear(A).expect("clear");
    assert_eq!(i.clear(Worker::new(77)), Err(ApplyError::UnknownWorker));
    i.apply_event(B, &KvEvent::AllBlocksCleared)
        .expect("cleared");
    assert_eq!(sorted(i.find_matches_for_tokens(&t, false)), vec![(C, 2)]);
    assert_eq!(i.workers(), vec![(A, 0), (B, 0), (C, 2)]);
    // remove_worker takes every rank of the id.
    let c0 = Worker { id: 3, dp_rank: 0 };
    stored(&i, c0, None, &h, &t);
    i.remove_worker(3);
    i.remove_worker(12345);
    assert_eq!(i.workers(), vec![(A, 0), (B, 0)]);
    assert!(i.find_matches_for_tokens(&t, false).scores.is_empty());
    assert_eq!(i.stats().blocks, 0);
    assert_eq!(i.stats().held, 0);
}

#[test]
fn early_exit_stops_at_one_worker() {
    let i = idx();
    let t: Vec<u32> = (1..=8).collect();
    let h = names(&t);
    stored(&i, A, None, &h, &t);
    stored(&i, B, None, &h[..1], &t[..2]);
    assert_eq!(
        sorted(i.find_matches_for_tokens(&t, true)),
        vec![(A, 2), (B, 1)]
    );
    assert_eq!(
        sorted(i.find_matches_for_tokens(&t, false)),
        vec![(A, 4), (B, 1)]
    );
}

#[test]
fn other_media_are_ignored_and_bad_ranks_refused() {
    let i = idx();
    let e = KvEvent::BlockStored {
        block_hashes: vec![1],
        parent_block_hash: None,
        token_ids: vec![1, 2],
        block_size: 2,
        lora_id: None,
        // `CPU` is the store's tier (tests/store_events.rs); others go.
        medium: Some("DISK".into()),
    };
    assert_eq!(i.apply_event(A, &e), Ok(false));
    let batch = Batch {
        ts: 0.0,
        events: vec![e.clone()],
        data_parallel_rank: Some(-1),
    };
    assert_eq!(i.apply(1, &batch).errors, vec![ApplyError::BadRank]);
    assert!(i.workers().is_empty());
    assert_eq!(i.stats().ignored, 1);
}

#[test]
fn workers_hashing_differently_share_blocks() {
    // The tree is keyed by tokens: a vLLM worker with its own hash seed
    // names the same blocks differently and still matches.
    let i = idx();
    let t = [1, 2, 3, 4];
    stored(&i, A, None, &names(&t), &t);
    stored(&i, B, None, &[1001], &t[..2]);
    stored(&i, B, Some(1001), &[1002], &t[2..]);
    assert_eq!(
        sorted(i.find_matches_for_tokens(&t, false)),
        vec![(A, 2), (B, 2)]
    );
    i.remove(B, &[1002]).expect("remove");
    assert_eq!(
        sorted(i.find_matches_for_tokens(&t, false)),
        vec![(A, 2), (B, 1)]
    );
}

#[test]
fn sha256_cbor_keys_chain_over_tokens() {
    let scheme = Scheme::new(crate::events::hash::SchemeName::Sha256Cbor, "0");
    let i = KvIndex::new(IndexConfig {
        block_size: 2,
        scheme: scheme.clone(),
    })
    .expect("index");
    let t = [1, 2, 3, 4, 5, 6];
    let h = scheme.prompt(&t, 2);
    stored(&i, A, None, &h[..1], &t[..2]);
    stored(&i, A, Some(h[0]), &h[1..], &t[2..]);
    assert_eq!(i.keys_for_tokens(&t), h);
    assert_eq!(sorted(i.find_matches(&h, false)), vec![(A, 3)]);
    assert_eq!(
        i.store(A, None, &[StoredBlock { hash: 1, local: 1 }]),
        Err(ApplyError::NeedsTokens)
    );
}

#[test]
fn store_by_local_hashes_matches_store_by_tokens() {
    let i = idx();
    let t: Vec<u32> = (10..18).collect();
    let mut buf = Vec::new();
    let blocks: Vec<StoredBlock> = t
        .chunks(2)
        .zip(names(&t))
        .map(|(c, h)| StoredBlock {
            hash: h,
            local: hash::xxh3_local(c, &mut buf),
        })
        .collect();
    i.store(A, None, &blocks).expect("store");
    assert_eq!(sorted(i.find_matches_for_tokens(&t, false)), vec![(A, 4)]);
    assert_eq!(i.keys_for_tokens(&t), names(&t));
}

#[test]
fn many_workers_many_blocks_grow_and_widen() {
    let i = idx();
    let t: Vec<u32> = (0..400).collect();
    let h = names(&t);
    // 150 workers (three membership words), worker n holds n % 200 blocks.
    for n in 0..150u64 {
        let k = (n as usize * 7) % 200 + 1;
        stored(&i, Worker::new(n), None, &h[..k], &t[..2 * k]);
    }
    let s = i.find_matches_for_tokens(&t, false);
    for n in 0..150u64 {
        let k = (n as u32 * 7) % 200 + 1;
        assert_eq!(s.score(Worker::new(n)), Some(k), "worker {n}");
    }
    // Slots freed by remove_worker are reused without mixing workers up.
    for n in 0..100u64 {
        i.remove_worker(n);
    }
    for n in 1000..1100u64 {
        stored(&i, Worker::new(n), None, &h[..1], &t[..2]);
    }
    let s = i.find_matches_for_tokens(&t, false);
    assert_eq!(s.scores.len(), 150);
    for n in 1000..1100u64 {
        assert_eq!(s.score(Worker::new(n)), Some(1));
    }
    for n in 100..150u64 {
        assert_eq!(s.score(Worker::new(n)), Some((n as u32 * 7) % 200 + 1));
    }
}

#[test]
fn zero_block_size_is_refused() {
    assert_eq!(
        KvIndex::new(IndexConfig::xxh3(0)).err(),
        Some(IndexConfigError::ZeroBlockSize)
    );
}

#[test]
fn a_name_reused_for_other_tokens_moves() {
    let i = idx();
    // A worker with its own names: 100 first names tokens [1, 2], then
    // [3, 4] (a worker that reused a hash): one block held, the new one.
    stored(&i, B, None, &[100], &[1, 2]);
    stored(&i, B, None, &[100], &[3, 4]);
    assert_eq!(i.workers(), vec![(B, 1)]);
    assert!(i.find_matches_for_tokens(&[1, 2], false).scores.is_empty());
    assert_eq!(
        sorted(i.find_matches_for_tokens(&[3, 4], false)),
        vec![(B, 1)]
    );
    // The same for a name that is the index's own key of other tokens.
    let k = names(&[5, 6])[0];
    stored(&i, A, None, &[k], &[5, 6]);
    stored(&i, A, None, &[k], &[7, 8]);
    let mut w = i.workers();
    w.sort_unstable();
    assert_eq!(w, vec![(A, 1), (B, 1)]);
    assert!(i.find_matches_for_tokens(&[5, 6], false).scores.is_empty());
    assert_eq!(
        sorted(i.find_matches_for_tokens(&[7, 8], false)),
        vec![(A, 1)]
    );
    i.remove(A, &[k]).expect("remove");
    i.remove(B, &[100]).expect("remove");
    let mut w = i.workers();
    w.sort_unstable();
    assert_eq!(w, vec![(A, 0), (B, 0)]);
    assert_eq!(i.stats().blocks, 0);
    assert_eq!(i.stats().held, 0);
}
