//! `radixd index serve`: one [`KvIndex`] fed by N KV event publishers and
//! answering queries on a ZeroMQ REP socket ([`protocol`]).
//!
//! One thread per publisher owns its [`Subscriber`] (SUB, and a DEALER to
//! the replay socket when one is given: history from sequence 0 at start,
//! gaps after), decodes batches and applies them; the calling thread owns
//! the REP socket and answers queries from the index without waiting for
//! the appliers. A publisher that disappears, a replay socket that never
//! answers, garbage frames: counted per feed and logged, never more than
//! that one worker's state at stake.

use std::collections::VecDeque;
use std::fmt;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use radixd_ipc::sync::{AtomicU32, AtomicU64, Ordering};

use super::protocol::{self, error_answer, scores_answer, text, Keys, Request};
use super::{ApplyError, IndexConfig, KvIndex, Worker};
use crate::events::msgpack::Value;
use crate::events::subscriber::Subscriber;

/// One publisher to follow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subscription {
    /// The worker's name in answers.
    pub name: String,
    /// Its PUB endpoint.
    pub endpoint: String,
    /// Its replay (ROUTER) endpoint, if any.
    pub replay: Option<String>,
}

impl Subscription {
    /// Parses `WORKER=PUB_ENDPOINT[@REPLAY_ENDPOINT]`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let (name, rest) = s
            .split_once('=')
            .ok_or_else(|| format!("{s:?} is not WORKER=PUB_ENDPOINT[@REPLAY_ENDPOINT]"))?;
        if name.is_empty() || rest.is_empty() {
            return Err(format!("{s:?}: empty worker name or endpoint"));
        }
        // An `@` starts the replay endpoint when what follows is one.
        let (endpoint, replay) = match rest.rfind('@') {
            Some(i) if rest[i + 1..].contains("://") => {
                (rest[..i].to_string(), Some(rest[i + 1..].to_string()))
            }
            _ => (rest.to_string(), None),
        };
        if !endpoint.contains("://") {
            return Err(format!(
                "{endpoint:?} is not a ZeroMQ endpoint (tcp://…, ipc://…)"
            ));
        }
        Ok(Self {
            name: name.to_string(),
            endpoint,
            replay,
        })
    }
}

/// What `serve` needs.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// REP endpoint (bound) for queries.
    pub listen: String,
    /// The publishers; worker ids are their positions.
    pub subscriptions: Vec<Subscription>,
    /// Block size and hashing.
    pub index: IndexConfig,
    /// Topic prefix to subscribe to (`""`: all).
    pub topic: String,
    /// How long a replay may take before it counts as failed.
    pub replay_timeout: Duration,
}

/// Why the server could not run.
#[derive(Debug)]
pub enum ServerError {
    /// A bad configuration.
    Config(String),
    /// A ZeroMQ call failed.
    Zmq(&'static str, zmq::Error),
    /// A thread could not start.
    Thread(std::io::Error),
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Config(m) => write!(f, "bad index configuration: {m}"),
            Self::Zmq(what, e) => write!(f, "ZeroMQ: cannot {what}: {e}"),
            Self::Thread(e) => write!(f, "cannot start a thread: {e}"),
        }
    }
}

impl std::error::Error for ServerError {}

/// Per-publisher counters.
#[derive(Default)]
struct FeedStats {
    batches: AtomicU64,
    events: AtomicU64,
    refused: AtomicU64,
    malformed: AtomicU64,
    gaps: AtomicU64,
    replay_failures: AtomicU64,
    last_seq: AtomicU64,
}

/// Most recent query latencies kept for the percentiles.
const LATENCY_WINDOW: usize = 4096;

/// Log lines per feed before logging goes quiet (then every 1000th).
const LOUD: u64 = 10;

fn zmq_err(what: &'static str) -> impl Fn(zmq::Error) -> ServerError {
    move |e| ServerError::Zmq(what, e)
}

/// The name of `worker` in answers: the subscription's, `NAME:RANK` for a
/// data-parallel rank above 0.
fn worker_name(names: &[String], w: Worker) -> String {
    let base = usize::try_from(w.id)
        .ok()
        .and_then(|i| names.get(i))
        .cloned()
        .unwrap_or_else(|| w.id.to_string());
    if w.dp_rank == 0 {
        base
    } else {
        format!("{base}:{}", w.dp_rank)
    }
}

/// Runs until `stop` is non-zero; `ready` is called once the query socket
/// is bound and the feeds are started.
pub fn serve(
    config: &ServerConfig,
    stop: &AtomicU32,
    ready: impl FnOnce(),
) -> Result<(), ServerError> {
    if config.subscriptions.is_empty() {
        return Err(ServerError::Config("no --subscribe".into()));
    }
    let names: Vec<String> = config
        .subscriptions
        .iter()
        .map(|s| s.name.clone())
        .collect();
    for (i, n) in names.iter().enumerate() {
        if names[..i].contains(n) {
            return Err(ServerError::Config(format!("worker {n:?} named twice")));
        }
    }
    let index =
        KvIndex::new(config.index.clone()).map_err(|e| ServerError::Config(e.to_string()))?;
    let ctx = zmq::Context::new();
    let rep = ctx
        .socket(zmq::REP)
        .map_err(zmq_err("create the REP socket"))?;
    rep.set_linger(0).map_err(zmq_err("set the REP linger"))?;
    rep.bind(&config.listen)
        .map_err(zmq_err("bind the query socket"))?;
    for id in 0..names.len() {
        // Listed (tree size 0) before their first event.
        index.add_worker(Worker::new(id as u64));
    }
    let feeds: Vec<FeedStats> = names.iter().map(|_| FeedStats::default()).collect();
    thread::scope(|scope| {
        let (started_tx, started) = mpsc::channel();
        for (id, sub) in config.subscriptions.iter().enumerate() {
            let (index, stats, started) = (&index, &feeds[id], started_tx.clone());
            thread::Builder::new()
                .name(format!("index-feed-{id}"))
                .spawn_scoped(scope, move || {
                    feed(config, id as u64, sub, index, stats, stop, started)
                })
                .map_err(ServerError::Thread)?;
        }
        // Announced once every feed is subscribed and has its history (or
        // gave up on it), so what was published before is in the index.
        let deadline = Instant::now() + config.replay_timeout + Duration::from_secs(2);
        for _ in 0..names.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            if started.recv_timeout(left).is_err() {
                break;
            }
        }
        ready();
        let result = answer_loop(&rep, &index, &names, &feeds, stop);
        // The feeds stop with the server, whatever ended the loop.
        stop.store(1, Ordering::Relaxed);
        result
    })
}

/// One publisher's thread: subscribe (retrying), replay history, apply.
fn feed(
    config: &ServerConfig,
    id: u64,
    sub: &Subscription,
    index: &KvIndex,
    stats: &FeedStats,
    stop: &AtomicU32,
    started: mpsc::Sender<()>,
) {
    // Relaxed (all counters and `stop`): figures, and a lone flag.
    let stopped = || stop.load(Ordering::Relaxed) != 0;
    let mut logged = 0u64;
    let mut log = |msg: String| {
        logged += 1;
        if logged <= LOUD || logged % 1000 == 0 {
            eprintln!("radixd index: {}: {msg}", sub.name);
        }
    };
    let mut s = loop {
        match Subscriber::connect(&sub.endpoint, &config.topic, sub.replay.as_deref()) {
            Ok(s) => break s,
            Err(e) => log(format!("cannot subscribe: {e}")),
        }
        if stopped() {
            return;
        }
        thread::sleep(Duration::from_secs(1));
    };
    s.set_replay_timeout(config.replay_timeout);
    let mut startup_failures = 0u64;
    if sub.replay.is_some() {
        // Everything the publisher still buffers, from the first batch.
        if let Err(e) = s.replay_from(0, config.replay_timeout) {
            startup_failures = 1;
            log(format!("no history from the replay socket: {e}"));
        }
    }
    // The server may be gone already: nothing to tell then.
    let _ = started.send(());
    while !stopped() {
        match s.recv(Duration::from_millis(100)) {
            Ok(Some(r)) => {
                let report = index.apply(id, &r.batch);
                stats.batches.fetch_add(1, Ordering::Relaxed);
                stats.last_seq.store(r.seq, Ordering::Relaxed);
                stats
                    .events
                    .fetch_add(report.applied as u64, Ordering::Relaxed);
                if !report.errors.is_empty() {
                    stats
                        .refused
                        .fetch_add(report.errors.len() as u64, Ordering::Relaxed);
                    log(format!(
                        "batch {}: {} event(s) refused, first: {}",
                        r.seq,
                        report.errors.len(),
                        report.errors[0]
                    ));
                }
            }
            Ok(None) => {}
            Err(e) => log(format!("{e}")),
        }
        let (gaps, malformed, failures) = (s.gaps(), s.malformed(), s.replay_failures());
        if gaps > stats.gaps.load(Ordering::Relaxed) {
            log(format!(
                "{gaps} batch(es) lost so far (no replay could fill them)"
            ));
        }
        stats.gaps.store(gaps, Ordering::Relaxed);
        stats.malformed.store(malformed, Ordering::Relaxed);
        stats
            .replay_failures
            .store(failures + startup_failures, Ordering::Relaxed);
    }
}

/// The REP loop: one request, one answer, until `stop`.
fn answer_loop(
    rep: &zmq::Socket,
    index: &KvIndex,
    names: &[String],
    feeds: &[FeedStats],
    stop: &AtomicU32,
) -> Result<(), ServerError> {
    let mut latencies: VecDeque<u64> = VecDeque::with_capacity(LATENCY_WINDOW);
    let mut queries = 0u64;
    // Relaxed: a lone flag.
    while stop.load(Ordering::Relaxed) == 0 {
        match rep.poll(zmq::POLLIN, 100) {
            Ok(0) | Err(zmq::Error::EINTR) => continue,
            Ok(_) => {}
            Err(e) => return Err(ServerError::Zmq("wait for queries", e)),
        }
        // Every frame of the request is read (a REP socket answers only a
        // whole request); a request is one frame.
        let frames = match rep.recv_multipart(0) {
            Ok(f) => f,
            // Interrupted by a signal: look at `stop` again.
            Err(zmq::Error::EINTR) => continue,
            Err(e) => return Err(ServerError::Zmq("receive a query", e)),
        };
        let t0 = Instant::now();
        let decoded = match frames.as_slice() {
            [one] => Request::decode(one),
            _ => Err(protocol::ProtocolError::Shape("a request of one frame")),
        };
        let answer = match decoded {
            Err(e) => error_answer(e.kind(), &e.to_string()),
            Ok(Request::Query { keys, early_exit }) => {
                let scores = match &keys {
                    Keys::Tokens(t) => index.find_matches_for_tokens(t, early_exit),
                    Keys::Hashes(h) => index.find_matches(h, early_exit),
                };
                queries += 1;
                let a = scores_answer(&scores, |w| worker_name(names, w));
                if latencies.len() == LATENCY_WINDOW {
                    latencies.pop_front();
                }
                latencies.push_back(t0.elapsed().as_nanos() as u64);
                a
            }
            Ok(Request::Stats) => stats_answer(index, names, feeds, queries, &latencies),
        };
        // A REP socket must answer before it can receive again; a send
        // that fails (the peer went away) loses only that answer.
        if let Err(e) = rep.send(protocol::to_bytes(&answer), 0) {
            eprintln!("radixd index: cannot answer a query: {e}");
        }
    }
    Ok(())
}

/// The `q` quantile (0..=1) of `xs`, in microseconds.
fn quantile_us(xs: &VecDeque<u64>, q: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let mut v: Vec<u64> = xs.iter().copied().collect();
    v.sort_unstable();
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    v[i.min(v.len() - 1)] as f64 / 1000.0
}

fn stats_answer(
    index: &KvIndex,
    names: &[String],
    feeds: &[FeedStats],
    queries: u64,
    latencies: &VecDeque<u64>,
) -> Value {
    let s = index.stats();
    let uint = Value::UInt;
    // Relaxed (all): figures.
    let get = |a: &AtomicU64| uint(a.load(Ordering::Relaxed));
    let sizes = index.workers();
    let feeds = names
        .iter()
        .zip(feeds)
        .enumerate()
        .map(|(id, (name, f))| {
            let blocks: u64 = sizes
                .iter()
                .filter(|(w, _)| w.id == id as u64)
                .map(|(_, n)| n)
                .sum();
            Value::Map(vec![
                (text("name"), text(name)),
                (text("blocks"), uint(blocks)),
                (text("batches"), get(&f.batches)),
                (text("events"), get(&f.events)),
                (text("refused"), get(&f.refused)),
                (text("malformed"), get(&f.malformed)),
                (text("gaps"), get(&f.gaps)),
                (text("replay_failures"), get(&f.replay_failures)),
                (text("last_seq"), get(&f.last_seq)),
            ])
        })
        .collect();
    Value::Map(vec![
        (text("ok"), Value::Bool(true)),
        (text("workers"), uint(s.workers as u64)),
        (text("blocks"), uint(s.blocks as u64)),
        (text("held"), uint(s.held)),
        (text("events"), uint(s.events)),
        (text("ignored"), uint(s.ignored)),
        (text("queries"), uint(queries)),
        (
            text("query_p50_us"),
            Value::Float(quantile_us(latencies, 0.5)),
        ),
        (
            text("query_p99_us"),
            Value::Float(quantile_us(latencies, 0.99)),
        ),
        (text("table_bytes"), uint(s.table_bytes as u64)),
        (text("feeds"), Value::Array(feeds)),
        (
            text("errors"),
            Value::Map(
                ApplyError::KINDS
                    .iter()
                    .zip(s.errors)
                    .map(|(k, n)| (text(k), uint(n)))
                    .collect(),
            ),
        ),
    ])
}

/// A client of the query socket (`radixd index query`, tests).
pub struct IndexClient {
    req: zmq::Socket,
    timeout: Duration,
    // The socket first: it closes before the context ends.
    _ctx: zmq::Context,
}

/// Why a query got no answer.
#[derive(Debug)]
pub enum ClientError {
    /// A ZeroMQ call failed.
    Zmq(&'static str, zmq::Error),
    /// No answer within the timeout.
    Timeout(Duration),
    /// An answer that is not msgpack.
    BadAnswer(String),
}

impl ClientError {
    /// The `error` kind `radixd index query` prints.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Zmq(..) => "connect",
            Self::Timeout(_) => "timeout",
            Self::BadAnswer(_) => "bad_answer",
        }
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Zmq(what, e) => write!(f, "ZeroMQ: cannot {what}: {e}"),
            Self::Timeout(t) => write!(f, "no answer from the index within {t:?}"),
            Self::BadAnswer(m) => write!(f, "unreadable answer: {m}"),
        }
    }
}

impl std::error::Error for ClientError {}

impl IndexClient {
    /// A REQ socket connected to `endpoint`; each call waits `timeout`.
    pub fn connect(endpoint: &str, timeout: Duration) -> Result<Self, ClientError> {
        let ctx = zmq::Context::new();
        let e = |what| move |err| ClientError::Zmq(what, err);
        let req = ctx.socket(zmq::REQ).map_err(e("create the REQ socket"))?;
        req.set_linger(0).map_err(e("set the REQ linger"))?;
        // After a timeout the next request may go out anyway (and late
        // answers are told apart from it).
        req.set_req_relaxed(true)
            .map_err(e("relax the REQ socket"))?;
        req.set_req_correlate(true)
            .map_err(e("correlate the REQ socket"))?;
        req.connect(endpoint).map_err(e("connect to the index"))?;
        Ok(Self {
            req,
            timeout,
            _ctx: ctx,
        })
    }

    /// Sends `request` and returns the decoded answer.
    pub fn call(&self, request: &Request) -> Result<Value, ClientError> {
        self.req
            .send(request.encode(), 0)
            .map_err(|e| ClientError::Zmq("send the request", e))?;
        let ms = i64::try_from(self.timeout.as_millis()).unwrap_or(i64::MAX);
        let ready = self
            .req
            .poll(zmq::POLLIN, ms)
            .map_err(|e| ClientError::Zmq("wait for the answer", e))?;
        if ready == 0 {
            return Err(ClientError::Timeout(self.timeout));
        }
        let bytes = self
            .req
            .recv_bytes(0)
            .map_err(|e| ClientError::Zmq("receive the answer", e))?;
        crate::events::msgpack::decode(&bytes).map_err(|e| ClientError::BadAnswer(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscriptions_parse() {
        assert_eq!(
            Subscription::parse("a=tcp://127.0.0.1:5557@tcp://127.0.0.1:5558"),
            Ok(Subscription {
                name: "a".into(),
                endpoint: "tcp://127.0.0.1:5557".into(),
                replay: Some("tcp://127.0.0.1:5558".into()),
            })
        );
        assert_eq!(
            Subscription::parse("w-1=ipc:///tmp/x@y").map(|s| (s.endpoint, s.replay)),
            Ok(("ipc:///tmp/x@y".into(), None))
        );
        for bad in ["", "a", "=tcp://x:1", "a=", "a=nothing"] {
            assert!(Subscription::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn names_carry_ranks() {
        let names = vec!["a".to_string()];
        assert_eq!(worker_name(&names, Worker::new(0)), "a");
        assert_eq!(worker_name(&names, Worker { id: 0, dp_rank: 2 }), "a:2");
        assert_eq!(worker_name(&names, Worker::new(9)), "9");
    }
}
