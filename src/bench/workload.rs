//! The prompts workers send: synthetic (shared system prompts, few-shot
//! blocks, repeated user turns) or drawn from a Mooncake trace.

use std::io::BufReader;
use std::path::Path;

use super::BenchError;
use crate::replay::parse_trace;

/// Prompts for worker `worker` of `workers`: trace requests dealt
/// round-robin, each block id expanded to `block_size` tokens, cut to
/// `max_tokens`.
pub(super) fn load_prompts(
    path: &Path,
    block_size: u32,
    max_tokens: u32,
    worker: u32,
    workers: u32,
) -> Result<Vec<Vec<u32>>, BenchError> {
    let file = std::fs::File::open(path)?;
    let requests = parse_trace(BufReader::new(file), &path.display().to_string())
        .map_err(|e| BenchError::Args(e.to_string()))?;
    let prompts: Vec<Vec<u32>> = requests
        .iter()
        .skip(worker as usize)
        .step_by(workers.max(1) as usize)
        .map(|r| {
            let len = (r.input_length as usize).min(max_tokens as usize);
            let tokens = r.hash_ids.iter().flat_map(|&id| {
                (0..block_size).map(move |i| (id as u32).wrapping_mul(block_size).wrapping_add(i))
            });
            tokens.take(len).collect()
        })
        .filter(|p: &Vec<u32>| !p.is_empty())
        .collect();
    if prompts.is_empty() {
        return Err(BenchError::Args(format!(
            "{} holds no prompt for worker {worker}",
            path.display()
        )));
    }
    Ok(prompts)
}

/// A tiny deterministic generator (xorshift), so runs repeat exactly
/// (`bench` workers and the `multi_scheduler` example draw prompts with it).
pub struct Rng(pub u64);

impl Rng {
    /// The next number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u32) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % u64::from(n.max(1))) as u32
    }
}

/// Synthetic prompt `step` of `worker`: one of 4 system prompts, one of 16
/// few-shot blocks, and the user's turn (a quarter of them repeat an
/// earlier one, as multi-turn chats do).
pub(super) fn synthetic_prompt(rng: &mut Rng, worker: u32, step: u32, tokens: u32) -> Vec<u32> {
    let system = rng.below(4);
    let shot = rng.below(16);
    let user = if step > 0 && rng.below(4) == 0 {
        rng.below(step)
    } else {
        step
    };
    let part = tokens / 4;
    let mut p: Vec<u32> = (0..part).map(|i| 1 << 30 | system << 20 | i).collect();
    p.extend((0..part).map(|i| 2 << 30 | shot << 20 | i));
    p.extend(
        (0..tokens - 2 * part)
            .map(|i| 3 << 30 | (worker & 0xff) << 22 | (user & 0x3fff) << 8 | (i & 0xff)),
    );
    p
}
