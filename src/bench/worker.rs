//! One worker process: scheduler steps against a backend, timed.

use std::io::{self, Write};
use std::path::Path;
use std::time::Instant;

use radixd_ipc::copy;

use super::workload::{load_prompts, synthetic_prompt, Rng};
use super::{BenchError, Transport, UdsClient, WorkerArgs, WorkerReport, EVICT_EVERY};
use crate::engine::Config;
use crate::op::{Backend, Reply, Request};
use crate::Client;

/// The hidden `bench-worker` subcommand: connect, say "ready", wait for
/// "go", run the steps, print one JSON report.
pub fn worker(args: &WorkerArgs) -> Result<(), BenchError> {
    let config = Config {
        page_size: args.page_size,
        capacity: args.capacity,
    };
    let mut backend: Box<dyn Backend> = match args.transport {
        Transport::Shm => {
            Box::new(Client::connect(&args.target).map_err(|e| BenchError::Server(e.to_string()))?)
        }
        Transport::Uds => Box::new(UdsClient::connect(Path::new(&args.target), config)?),
    };
    let prompts = match &args.trace {
        Some(path) => Some(load_prompts(
            path,
            args.block_size,
            args.prompt_tokens,
            args.worker,
            args.workers,
        )?),
        None => None,
    };
    let mut stdout = io::stdout().lock();
    writeln!(stdout, "ready")?;
    stdout.flush()?;
    let mut go = String::new();
    io::stdin().read_line(&mut go)?;

    let mut report = WorkerReport::default();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (u64::from(args.worker) + 1) << 17);
    let start = Instant::now();
    for step in 0..args.requests {
        let prompt = match &prompts {
            Some(p) => p[step as usize % p.len()].clone(),
            None => synthetic_prompt(&mut rng, args.worker, step, args.prompt_tokens),
        };
        scheduler_step(backend.as_mut(), &prompt, args.page_size, step, &mut report);
    }
    report.elapsed_ns = start.elapsed().as_nanos() as u64;
    writeln!(
        stdout,
        "{}",
        serde_json::to_string(&report).map_err(|e| BenchError::Worker(e.to_string()))?
    )?;
    Ok(())
}

/// One step of a scheduler: match+lock, alloc the rest, insert, unlock.
fn scheduler_step(
    backend: &mut dyn Backend,
    prompt: &[u32],
    page_size: u32,
    step: u32,
    report: &mut WorkerReport,
) {
    let mut timed = |op: &str, request: Request| {
        let t = Instant::now();
        let result = backend.call(request);
        report
            .samples
            .entry(op.to_owned())
            .or_default()
            .push(t.elapsed().as_nanos() as u64);
        if result.is_err() {
            report.rejected += 1;
        }
        result.ok()
    };
    let (len, mut pages, handle) = match timed(
        "match",
        Request::Match {
            tokens: copy::to_vec(prompt),
            lock: true,
        },
    ) {
        Some(Reply::Matched {
            len, pages, handle, ..
        }) => (len, pages, handle),
        _ => (0, Vec::new(), None),
    };
    let whole = prompt.len() / page_size as usize;
    if let Some(Reply::Pages(fresh)) = timed(
        "alloc",
        Request::Alloc {
            n: (whole - pages.len()) as u64,
        },
    ) {
        pages.extend(fresh);
        timed(
            "insert",
            Request::Insert {
                tokens: copy::to_vec(prompt),
                pages,
                lock: false,
            },
        );
    }
    if let Some(handle) = handle {
        timed("unlock", Request::Unlock { handle });
    }
    if step % EVICT_EVERY == EVICT_EVERY - 1 {
        timed(
            "evict",
            Request::Evict {
                tokens: u64::from(4 * page_size),
            },
        );
    }
    report.hit_tokens += len;
    report.prompt_tokens += prompt.len() as u64;
}
