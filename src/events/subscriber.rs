//! The consumer side: a ZeroMQ SUB socket (and optionally a DEALER for
//! replays) that yields decoded batches in sequence order without gaps, as
//! vLLM's `examples/online_serving/kv_events_subscriber.py` does: on a gap
//! it asks the replay socket for what it missed.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::batch::{decode_batch, Batch};
use super::publisher::END_SEQ;
use super::EventsError;

/// One batch and its sequence number.
#[derive(Clone, Debug, PartialEq)]
pub struct Received {
    /// The batch's sequence number.
    pub seq: u64,
    /// Its events.
    pub batch: Batch,
}

/// A subscriber to a radixd (or vLLM) KV event stream.
pub struct Subscriber {
    sub: zmq::Socket,
    replay: Option<zmq::Socket>,
    /// The next sequence number to deliver, once known.
    next: Option<u64>,
    ready: VecDeque<Received>,
    /// Sequence numbers skipped because no replay could fill them.
    gaps: u64,
    /// Payloads that did not decode (live or replayed).
    malformed: u64,
    /// Replay requests that got no (complete) answer.
    replay_failures: u64,
    /// How long a gap's replay may take.
    replay_timeout: Duration,
    // Sockets first: they close before the context ends.
    _ctx: zmq::Context,
}

fn zmq_err(what: &'static str) -> impl Fn(zmq::Error) -> EventsError {
    move |e| EventsError::Zmq(what, e)
}

/// Receives one message of exactly three frames from `socket`; `what` names
/// the receive in errors, `malformed` describes a message of another number
/// of frames.
fn three_frames(
    socket: &zmq::Socket,
    what: &'static str,
    malformed: impl FnOnce(usize) -> String,
) -> Result<[Vec<u8>; 3], EventsError> {
    let frames = socket.recv_multipart(0).map_err(zmq_err(what))?;
    let n = frames.len();
    <[Vec<u8>; 3]>::try_from(frames).map_err(|_| EventsError::Malformed(malformed(n)))
}

impl Subscriber {
    /// Connects a SUB socket to `endpoint` for `topic` (a prefix; `""`: all),
    /// and a DEALER to `replay` when given.
    pub fn connect(endpoint: &str, topic: &str, replay: Option<&str>) -> Result<Self, EventsError> {
        let ctx = zmq::Context::new();
        let sub = ctx
            .socket(zmq::SUB)
            .map_err(zmq_err("create the SUB socket"))?;
        sub.set_rcvhwm(0)
            .map_err(zmq_err("set the SUB high-water mark"))?;
        sub.set_subscribe(topic.as_bytes())
            .map_err(zmq_err("subscribe"))?;
        sub.set_linger(0).map_err(zmq_err("set the SUB linger"))?;
        sub.connect(endpoint)
            .map_err(zmq_err("connect the SUB socket"))?;
        let replay = match replay {
            None => None,
            Some(ep) => {
                let d = ctx
                    .socket(zmq::DEALER)
                    .map_err(zmq_err("create the DEALER socket"))?;
                d.set_rcvhwm(0)
                    .map_err(zmq_err("set the DEALER high-water mark"))?;
                d.set_linger(0).map_err(zmq_err("set the DEALER linger"))?;
                d.connect(ep)
                    .map_err(zmq_err("connect the replay socket"))?;
                Some(d)
            }
        };
        Ok(Self {
            sub,
            replay,
            next: None,
            ready: VecDeque::new(),
            gaps: 0,
            malformed: 0,
            replay_failures: 0,
            replay_timeout: Duration::from_secs(5),
            _ctx: ctx,
        })
    }

    /// Sequence numbers lost for want of a replay socket (or buffer).
    pub fn gaps(&self) -> u64 {
        self.gaps
    }

    /// Payloads that did not decode, live or replayed.
    pub fn malformed(&self) -> u64 {
        self.malformed
    }

    /// Replay requests that timed out or were cut short.
    pub fn replay_failures(&self) -> u64 {
        self.replay_failures
    }

    /// How long the replay of a gap may take (5 s by default).
    pub fn set_replay_timeout(&mut self, timeout: Duration) {
        self.replay_timeout = timeout;
    }

    /// Starts delivery at `from`: asks the replay socket for every batch it
    /// still holds from there on.
    pub fn replay_from(&mut self, from: u64, timeout: Duration) -> Result<(), EventsError> {
        self.next = Some(from);
        self.ready.clear();
        let got = self.fetch(from, timeout)?;
        for r in got {
            if self.next.is_some_and(|n| r.seq == n) {
                self.next = Some(r.seq + 1);
                self.ready.push_back(r);
            }
        }
        Ok(())
    }

    /// Asks for every buffered batch from `from` on, up to the end marker.
    fn fetch(&mut self, from: u64, timeout: Duration) -> Result<Vec<Received>, EventsError> {
        let Some(replay) = &self.replay else {
            return Err(EventsError::Config("no replay endpoint to ask".into()));
        };
        let request: [&[u8]; 2] = [b"", &from.to_be_bytes()];
        replay
            .send_multipart(request, 0)
            .map_err(zmq_err("send a replay request"))?;
        let deadline = Instant::now() + timeout;
        let mut out = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ms = i64::try_from(left.as_millis()).unwrap_or(i64::MAX);
            if ms == 0
                || replay
                    .poll(zmq::POLLIN, ms)
                    .map_err(zmq_err("wait for a replay answer"))?
                    == 0
            {
                return Err(EventsError::Malformed(format!(
                    "no end of replay within {timeout:?}"
                )));
            }
            // A DEALER keeps the empty delimiter: ["", seq, payload].
            let [_, seq, payload] = three_frames(replay, "receive a replay answer", |n| {
                format!("replay answer of {n} frames")
            })?;
            if seq.as_slice() == END_SEQ || payload.is_empty() {
                return Ok(out);
            }
            let seq = seq_of(&seq)?;
            // A batch that does not decode is left out (a gap the caller
            // counts); the replay goes on.
            match decode_batch(&payload) {
                Ok(batch) => out.push(Received { seq, batch }),
                Err(_) => self.malformed += 1,
            }
        }
    }

    /// The next batch in sequence order, waiting up to `timeout`; `None`
    /// when none came. A gap in the live stream is filled from the replay
    /// socket, or skipped (and counted) without one.
    pub fn recv(&mut self, timeout: Duration) -> Result<Option<Received>, EventsError> {
        if let Some(r) = self.ready.pop_front() {
            return Ok(Some(r));
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ms = i64::try_from(left.as_millis()).unwrap_or(i64::MAX);
            if self
                .sub
                .poll(zmq::POLLIN, ms)
                .map_err(zmq_err("wait for events"))?
                == 0
            {
                return Ok(None);
            }
            let [_topic, seq, payload] = three_frames(&self.sub, "receive events", |n| {
                format!("message of {n} frames, expected topic, sequence, payload")
            })?;
            let seq = seq_of(&seq)?;
            match self.next {
                Some(n) if seq < n => continue,
                Some(n) if seq > n => {
                    if self.replay.is_some() {
                        // A replay socket that does not answer costs this
                        // stream the gap, not the stream.
                        match self.fetch(n, self.replay_timeout) {
                            Ok(got) => {
                                for r in got {
                                    if Some(r.seq) == self.next && r.seq < seq {
                                        n_push(&mut self.ready, &mut self.next, r);
                                    }
                                }
                            }
                            Err(_) => self.replay_failures += 1,
                        }
                    }
                    let n = self.next.unwrap_or(seq);
                    self.gaps += seq.saturating_sub(n);
                }
                _ => {}
            }
            // Past this message either way: a payload that does not decode
            // is reported once, not asked for again as a gap.
            self.next = Some(seq + 1);
            match decode_batch(&payload) {
                Ok(batch) => self.ready.push_back(Received { seq, batch }),
                Err(e) => {
                    self.malformed += 1;
                    if self.ready.is_empty() {
                        return Err(EventsError::Malformed(e.to_string()));
                    }
                }
            }
            return Ok(self.ready.pop_front());
        }
    }
}

fn n_push(ready: &mut VecDeque<Received>, next: &mut Option<u64>, r: Received) {
    *next = Some(r.seq + 1);
    ready.push_back(r);
}

fn seq_of(frame: &[u8]) -> Result<u64, EventsError> {
    <[u8; 8]>::try_from(frame)
        .map(u64::from_be_bytes)
        .map_err(|_| EventsError::Malformed(format!("sequence frame of {} bytes", frame.len())))
}
