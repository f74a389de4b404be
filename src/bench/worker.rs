//! One worker process: scheduler steps against a backend, timed.

use std::io::{self, Write};
use std::path::Path;
use std::time::Instant;

use radixd_ipc::copy;

use super::latency::{monotonic_ns, page_key};
use super::workload::{load_prompts, synthetic_prompt, Rng};
use super::{BenchError, Transport, UdsClient, WorkerArgs, WorkerReport, EVICT_EVERY};
use crate::engine::Config;
use crate::op::{Backend, Reply, Request};
use crate::Client;

/// The hidden `bench-worker` subcommand: connect, say "ready", wait for
/// "go", run the steps, print one JSON report.
pub fn worker(args: &WorkerArgs) -> Result<(), BenchError> {
    if args.reader {
        return reader(args);
    }
    let config = Config {
        page_size: args.page_size,
        capacity: args.capacity,
    };
    let mut backend: Box<dyn Backend> = match args.transport {
        Transport::Shm => {
            let mut client =
                Client::connect(&args.target).map_err(|e| BenchError::Server(e.to_string()))?;
            client.set_anchoring(!args.full_requests);
            if let Some(group) = &args.group {
                client
                    .join(group, args.rank, args.group_size)
                    .map_err(|e| BenchError::Server(format!("join: {e}")))?;
            }
            Box::new(client)
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
    ready_then_go(&mut stdout)?;

    let mut report = WorkerReport::default();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (u64::from(args.worker) + 1) << 17);
    // A MAMBA daemon: each step also checkpoints a state with its insert.
    let mamba = backend.components().mamba.is_some();
    let start = Instant::now();
    for step in 0..args.requests {
        let prompt = match &prompts {
            Some(p) => p[step as usize % p.len()].clone(),
            None => synthetic_prompt(&mut rng, args.worker, step, args.prompt_tokens),
        };
        scheduler_step(
            backend.as_mut(),
            &prompt,
            args.page_size,
            step,
            Step {
                mamba,
                stamp: args.stamp_inserts,
            },
            &mut report,
        );
    }
    report.elapsed_ns = start.elapsed().as_nanos() as u64;
    send(&mut stdout, &report)
}

/// What a step does besides the plain one.
#[derive(Clone, Copy)]
struct Step {
    /// Take a state slot and checkpoint it with the insert.
    mamba: bool,
    /// Note when an insert that cached pages is answered
    /// (`WorkerReport::answered`).
    stamp: bool,
}

/// One step of a scheduler: match+lock, alloc the rest, insert, unlock
/// (with MAMBA, a state slot taken and checkpointed with the insert, and
/// freed when the prompt's node held one already).
fn scheduler_step(
    backend: &mut dyn Backend,
    prompt: &[u32],
    page_size: u32,
    step: u32,
    Step { mamba, stamp }: Step,
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
        let state = match mamba.then(|| timed("alloc_state", Request::AllocState)) {
            Some(Some(Reply::State { state })) => Some(state),
            _ => None,
        };
        let insert = match state {
            None => Request::Insert {
                tokens: copy::to_vec(prompt),
                pages,
                lock: false,
            },
            Some(_) => Request::InsertWith {
                tokens: copy::to_vec(prompt),
                pages,
                lock: false,
                mamba_state: state,
                swa_evicted: 0,
            },
        };
        let inserted = timed("insert", insert);
        // The answer is in: the change it reports is acknowledged.
        let answered = stamp.then(monotonic_ns);
        let fresh = match &inserted {
            Some(Reply::Inserted { cached, len, .. } | Reply::InsertedWith { cached, len, .. }) => {
                *cached < *len
            }
            _ => false,
        };
        if let (Some(at), true) = (answered, fresh) {
            if let Some(key) = page_key(prompt, page_size as usize) {
                report.answered.push([key, at]);
            }
        }
        if let (
            Some(state),
            Some(Reply::InsertedWith {
                mamba_exist: true, ..
            }),
        ) = (state, inserted)
        {
            timed(
                "free_state",
                Request::FreeState {
                    state: u64::from(state),
                },
            );
        }
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

/// Most peeks a reader keeps samples of (bounds its memory).
const MAX_PEEKS: usize = 4_000_000;

/// A `--readers` worker: caches a prompt of its own (locked, so the
/// writers' evictions leave it), says "ready", waits for "go", then peeks
/// it lock-free until its stdin closes (the writers are done), and prints
/// one JSON report: the latency of every peek that answered, exactly, and
/// how many kept colliding with writes.
fn reader(args: &WorkerArgs) -> Result<(), BenchError> {
    let server = |e: crate::ClientError| BenchError::Server(e.to_string());
    let mut client = Client::connect(&args.target).map_err(server)?;
    let p = args.page_size.max(1);
    let whole = args.prompt_tokens / p * p;
    // Tokens no writer's prompt uses, distinct per reader.
    let base = 3_000_000_000u32.wrapping_add(args.worker.wrapping_mul(args.prompt_tokens));
    let prompt: Vec<u32> = (0..whole).map(|t| base.wrapping_add(t)).collect();
    let pages = client.alloc(u64::from(whole / p)).map_err(server)?;
    client.insert(&prompt, &pages, true).map_err(server)?;

    let mut stdout = io::stdout().lock();
    ready_then_go(&mut stdout)?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    std::thread::spawn(move || {
        // Whatever arrives, or the end of input: the writers are done.
        let mut rest = String::new();
        let _ = io::stdin().read_line(&mut rest);
        // Relaxed: a lone flag; the loop below only needs to see it soon.
        flag.store(true, std::sync::atomic::Ordering::Relaxed);
    });

    let mut report = WorkerReport::default();
    let mut samples = Vec::new();
    let start = Instant::now();
    // Relaxed: as above.
    while !stop.load(std::sync::atomic::Ordering::Relaxed) && samples.len() < MAX_PEEKS {
        let t = Instant::now();
        match client.peek(&prompt) {
            Ok((len, got)) => {
                samples.push(t.elapsed().as_nanos() as u64);
                if len != prompt.len() || got != pages {
                    return Err(BenchError::Worker(format!(
                        "peek returned {len} tokens of a locked {}-token prompt",
                        prompt.len()
                    )));
                }
            }
            Err(crate::ClientError::Contended) => report.contended += 1,
            Err(e) => return Err(server(e)),
        }
    }
    report.elapsed_ns = start.elapsed().as_nanos() as u64;
    report.samples.insert("peek".to_owned(), samples);
    send(&mut stdout, &report)
}

/// Tells the parent this worker is ready, and waits for its "go".
fn ready_then_go(stdout: &mut impl Write) -> Result<(), BenchError> {
    writeln!(stdout, "ready")?;
    stdout.flush()?;
    let mut go = String::new();
    io::stdin().read_line(&mut go)?;
    Ok(())
}

/// Sends the parent this worker's report, one JSON line.
fn send(stdout: &mut impl Write, report: &WorkerReport) -> Result<(), BenchError> {
    let line = serde_json::to_string(report).map_err(|e| BenchError::Worker(e.to_string()))?;
    writeln!(stdout, "{line}")?;
    Ok(())
}
