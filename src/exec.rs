//! `radixd exec`: one JSON request per input line, one JSON answer per output
//! line, in order. A bad line gets an error answer and the stream goes on.

use std::io::{self, BufRead, Write};

use serde_json::{json, Map, Value};

pub mod store;

use crate::engine::{Components, InsertHints};
use crate::op::{Backend, ErrorKind, Rejection, Reply, Request};

/// Reads requests from `input` until it ends, answering each on `output`.
/// Answers are flushed whenever no further input is already buffered, so an
/// interactive driver sees each answer before it sends the next request.
pub fn run(
    backend: &mut impl Backend,
    input: impl BufRead,
    mut output: impl Write,
) -> io::Result<()> {
    let mut input = input;
    let mut line = Vec::new();
    let components = backend.components();
    loop {
        line.clear();
        if input.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let answer = match store::answer(backend, &line) {
            Some(answer) => answer,
            None => match parse_for(&line, &components) {
                Ok(mut request) => {
                    // A join without "page_size" is this connection's.
                    if let (Request::Join(j), Some(p)) = (&mut request, backend.page_size()) {
                        if j.page_size == 0 {
                            j.page_size = p;
                        }
                    }
                    render_for(backend.call(request), &components)
                }
                Err(rejection) => render(Err(rejection)),
            },
        };
        output.write_all(answer.as_bytes())?;
        output.write_all(b"\n")?;
        if input.fill_buf()?.is_empty() {
            output.flush()?;
        }
    }
    output.flush()
}

fn malformed(message: impl Into<String>) -> Rejection {
    Rejection::new(ErrorKind::Malformed, message)
}

/// Parses one request line (for a full-only cache).
pub fn parse(line: &[u8]) -> Result<Request, Rejection> {
    parse_for(line, &Components::full())
}

/// Parses one request line for a cache keeping `components`: with a
/// secondary component on, `match`, `insert`, `evict` and `stats` ask for
/// the hybrid parts of their answers; on a full-only cache they are
/// today's requests unless they name a component (which then fails with
/// `component_off`).
pub fn parse_for(line: &[u8], components: &Components) -> Result<Request, Rejection> {
    let hybrid = !components.is_full_only();
    let value: Value =
        serde_json::from_slice(line).map_err(|e| malformed(format!("invalid JSON: {e}")))?;
    let Value::Object(obj) = value else {
        return Err(malformed("a request must be a JSON object"));
    };
    let op = match obj.get("op") {
        Some(Value::String(op)) => op.as_str(),
        Some(_) => return Err(malformed("\"op\" must be a string")),
        None => return Err(malformed("missing \"op\"")),
    };
    if let Some(known) = known_fields(op) {
        if let Some(field) = obj
            .keys()
            .find(|k| !matches!(k.as_str(), "op" | "counted") && !known.contains(&k.as_str()))
        {
            return Err(malformed(format!("unknown field {field:?} for op {op:?}")));
        }
    }
    let f = Fields(&obj);
    let counted = f.flag("counted")?;
    let ns = f.namespace()?;
    if ns.is_some() && !matches!(op, "match" | "insert" | "insert_paired" | "session_commit") {
        return Err(malformed(format!("op {op:?} takes no \"ns\"")));
    }
    let request = match op {
        "alloc" => Request::Alloc { n: f.u64("n")? },
        "free" => Request::Free { pages: f.pages()? },
        "insert" => {
            let (tokens, pages, lock) = (f.tokens()?, f.pages()?, f.flag("lock")?);
            let mamba_state = f.state_opt("mamba_state")?;
            let swa_evicted = f.u64_or_zero("swa_evicted")?;
            // The eviction policy's hints (`Request::Hinted`): a plain
            // insert's only.
            let hints = InsertHints {
                priority: f.i64_or_zero("priority")?,
                inserted_len: f.u64_or_zero("inserted_len")?,
            };
            if hints != InsertHints::default() {
                if hybrid || mamba_state.is_some() || swa_evicted > 0 {
                    return Err(malformed(
                        "\"priority\" and \"inserted_len\" take a full-attention insert",
                    ));
                }
                Request::Hinted {
                    hints,
                    request: Box::new(Request::Insert {
                        tokens,
                        pages,
                        lock,
                    }),
                }
            } else if hybrid || mamba_state.is_some() || swa_evicted > 0 {
                Request::InsertWith {
                    tokens,
                    pages,
                    lock,
                    mamba_state,
                    swa_evicted,
                }
            } else {
                Request::Insert {
                    tokens,
                    pages,
                    lock,
                }
            }
        }
        "match" => {
            let (tokens, lock) = (f.tokens()?, f.flag("lock")?);
            if hybrid {
                Request::MatchWith { tokens, lock }
            } else {
                Request::Match { tokens, lock }
            }
        }
        "lock" => Request::Lock {
            handle: f.u64("handle")?,
        },
        "unlock" => Request::Unlock {
            handle: f.u64("handle")?,
        },
        "evict" => {
            let tokens = f.u64("tokens")?;
            let swa_tokens = f.u64_or_zero("swa_tokens")?;
            let mamba_states = f.u64_or_zero("mamba_states")?;
            if hybrid || swa_tokens > 0 || mamba_states > 0 {
                Request::EvictComponents {
                    tokens,
                    swa_tokens,
                    mamba_states,
                }
            } else {
                Request::Evict { tokens }
            }
        }
        "evict_leaf" => Request::EvictLeaf,
        "alloc_paired" => Request::AllocPaired { n: f.u64("n")? },
        "lock_paired" => Request::LockPaired {
            handle: f.u64("handle")?,
            pages: f.pages()?,
        },
        "insert_paired" => Request::InsertPaired {
            tokens: f.tokens()?,
            pages: f.pages()?,
            lock: f.flag("lock")?,
            mamba_state: f.state_opt("mamba_state")?,
            swa_evicted: f.u64_or_zero("swa_evicted")?,
            tail: match f.u64_or_zero("tail")? {
                0 => 0,
                _ => f.u32("tail")?,
            },
        },
        "alloc_states" => Request::AllocStates { n: f.u64("n")? },
        "free_states" => Request::FreeStates {
            states: f.states()?,
        },
        "alloc_state" => Request::AllocState,
        "free_state" => Request::FreeState {
            state: f.u64("state")?,
        },
        "free_swa" => Request::FreeSwa { pages: f.pages()? },
        "swa_pages" => Request::SwaPages { pages: f.pages()? },
        "session_commit" => Request::SessionCommit {
            session: f.session()?,
            tokens: f.tokens()?,
            pages: f.pages()?,
        },
        "session_release" => Request::SessionRelease {
            session: f.session()?,
        },
        "session_status" => Request::SessionStatus {
            session: f.session()?,
        },
        "stats" if hybrid => Request::StatsWith,
        "stats" => Request::Stats,
        "reset" => Request::Reset,
        "validate" => Request::Validate,
        "bind" => match f.get("pool")? {
            Value::String(pool) => Request::Bind { pool: pool.clone() },
            _ => return Err(malformed("\"pool\" must be a string")),
        },
        "join" => Request::Join(crate::op::Join {
            group: match f.get("group")? {
                Value::String(group) => group.clone(),
                _ => return Err(malformed("\"group\" must be a string")),
            },
            rank: f.u32("rank")?,
            size: f.u32("size")?,
            // Absent: the connection's (filled in by `run`).
            page_size: match f.u64_or_zero("page_size")? {
                0 => 0,
                _ => f.u32("page_size")?,
            },
        }),
        other => {
            return Err(Rejection::new(
                ErrorKind::UnknownOp,
                format!("unknown op {other:?}"),
            ))
        }
    };
    let request = match ns {
        Some(ns) => Request::Namespaced {
            ns,
            request: Box::new(request),
        },
        None => request,
    };
    // `"counted": true`: the answer carries the pools' free counts after
    // it (`Request::Counted`), for the requests that take a count.
    if !counted {
        return Ok(request);
    }
    if !request.takes_count() {
        return Err(malformed(format!("op {op:?} takes no \"counted\"")));
    }
    Ok(Request::Counted(Box::new(request)))
}

/// The fields `op` takes besides `"op"` (`None`: an unknown op, answered
/// `unknown_op`). Any other field is `malformed`: a field the engine would
/// ignore (a misspelt `"lock"`, a namespace this build cannot honour) must
/// never be answered as if it were not there.
fn known_fields(op: &str) -> Option<&'static [&'static str]> {
    Some(match op {
        "alloc" | "alloc_paired" | "alloc_states" => &["n"],
        "lock_paired" => &["handle", "pages"],
        "insert_paired" => &[
            "tokens",
            "pages",
            "lock",
            "mamba_state",
            "swa_evicted",
            "tail",
            "ns",
        ],
        "free_states" => &["states"],
        "free" | "free_swa" | "swa_pages" => &["pages"],
        "insert" => &[
            "tokens",
            "pages",
            "lock",
            "mamba_state",
            "swa_evicted",
            "priority",
            "inserted_len",
            "ns",
        ],
        "match" => &["tokens", "lock", "ns"],
        "lock" | "unlock" => &["handle"],
        "evict" => &["tokens", "swa_tokens", "mamba_states"],
        "free_state" => &["state"],
        "session_commit" => &["session", "tokens", "pages", "ns"],
        "session_release" | "session_status" => &["session"],
        "bind" => &["pool"],
        "join" => &["group", "rank", "size", "page_size"],
        "alloc_state" | "stats" | "reset" | "validate" => &[],
        _ => return None,
    })
}

/// Typed access to a request's fields, each failure a `malformed` rejection.
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn get(&self, name: &str) -> Result<&Value, Rejection> {
        self.0
            .get(name)
            .ok_or_else(|| malformed(format!("missing {name:?}")))
    }

    fn u64(&self, name: &str) -> Result<u64, Rejection> {
        self.get(name)?
            .as_u64()
            .ok_or_else(|| malformed(format!("{name:?} must be a non-negative integer")))
    }

    fn u32(&self, name: &str) -> Result<u32, Rejection> {
        u32::try_from(self.u64(name)?)
            .map_err(|_| malformed(format!("{name:?} must be below 2^32")))
    }

    /// An optional signed integer: absent or `null` is 0.
    fn i64_or_zero(&self, name: &str) -> Result<i64, Rejection> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(0),
            Some(v) => v
                .as_i64()
                .ok_or_else(|| malformed(format!("{name:?} must be an integer"))),
        }
    }

    /// An optional count: absent or `null` is 0.
    fn u64_or_zero(&self, name: &str) -> Result<u64, Rejection> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(0),
            Some(_) => self.u64(name),
        }
    }

    /// An optional state slot: absent or `null` is none; one beyond any
    /// pool is a slot the client cannot own.
    fn state_opt(&self, name: &str) -> Result<Option<u32>, Rejection> {
        let slot = match self.0.get(name) {
            None | Some(Value::Null) => return Ok(None),
            Some(_) => self.u64(name)?,
        };
        u32::try_from(slot).map(Some).map_err(|_| {
            Rejection::new(
                ErrorKind::StateNotOwned,
                format!("state slot {slot} is not owned by this client"),
            )
        })
    }

    fn flag(&self, name: &str) -> Result<bool, Rejection> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(malformed(format!("{name:?} must be true or false"))),
        }
    }

    fn array(&self, name: &str) -> Result<&Vec<Value>, Rejection> {
        self.get(name)?
            .as_array()
            .ok_or_else(|| malformed(format!("{name:?} must be an array")))
    }

    fn tokens(&self) -> Result<Vec<u32>, Rejection> {
        self.array("tokens")?
            .iter()
            .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
            .collect::<Option<_>>()
            .ok_or_else(|| malformed("\"tokens\" must hold integers in 0..2^32"))
    }

    /// State slots; one beyond any pool is a slot the client cannot own.
    fn states(&self) -> Result<Vec<u32>, Rejection> {
        self.array("states")?
            .iter()
            .map(|p| {
                let slot = p
                    .as_u64()
                    .ok_or_else(|| malformed("\"states\" must hold non-negative integers"))?;
                u32::try_from(slot).map_err(|_| {
                    Rejection::new(
                        ErrorKind::StateNotOwned,
                        format!("state slot {slot} is not owned by this client"),
                    )
                })
            })
            .collect()
    }

    /// Page ids; one too large for any pool is out of range, not malformed.
    fn pages(&self) -> Result<Vec<u32>, Rejection> {
        self.array("pages")?
            .iter()
            .map(|p| {
                let id = p
                    .as_u64()
                    .ok_or_else(|| malformed("\"pages\" must hold non-negative integers"))?;
                u32::try_from(id).map_err(|_| {
                    Rejection::new(
                        ErrorKind::PageOutOfRange,
                        format!("page {id} is out of range"),
                    )
                })
            })
            .collect()
    }

    /// `"ns"`: a namespace's name; absent or `null`, the default one. Its
    /// length is the engine's to check (`bad_namespace`).
    fn namespace(&self) -> Result<Option<String>, Rejection> {
        match self.0.get("ns") {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(malformed("\"ns\" must be a string")),
        }
    }

    fn session(&self) -> Result<String, Rejection> {
        match self.get("session")? {
            Value::String(s) => Ok(s.clone()),
            _ => Err(malformed("\"session\" must be a string")),
        }
    }
}

/// The answer line for a result (of a full-only cache).
pub fn render(result: Result<Reply, Rejection>) -> String {
    render_for(result, &Components::full())
}

/// The answer line for a result of a cache keeping `components`: the
/// hybrid fields of a component show only when it is on.
pub fn render_for(result: Result<Reply, Rejection>, components: &Components) -> String {
    value_for(result, components).to_string()
}

/// The answer line of [`render_for`], as a JSON value.
fn value_for(result: Result<Reply, Rejection>, components: &Components) -> Value {
    let (swa, mamba) = (components.swa.is_some(), components.mamba.is_some());
    match result {
        Err(r) => json!({"ok": false, "error": r.kind.name(), "message": r.message}),
        Ok(Reply::Pages(pages)) => json!({"ok": true, "pages": pages}),
        Ok(Reply::Done) => json!({"ok": true}),
        Ok(Reply::Locked(handle)) => json!({"ok": true, "handle": handle}),
        Ok(Reply::Inserted {
            cached,
            len,
            handle,
            locked,
        }) => {
            let mut v = json!({"ok": true, "cached": cached, "len": len});
            if locked {
                v["handle"] = json!(handle);
            }
            v
        }
        Ok(Reply::Matched { len, pages, handle }) => {
            json!({"ok": true, "len": len, "pages": pages, "handle": handle})
        }
        Ok(Reply::Evicted(tokens)) => json!({"ok": true, "evicted": tokens}),
        Ok(Reply::EvictedLeaf { handle, tokens }) => {
            json!({"ok": true, "handle": handle, "evicted": tokens})
        }
        Ok(Reply::Session {
            resident_tokens,
            idle_ms,
        }) => {
            json!({"ok": true, "resident_tokens": resident_tokens, "idle_ms": idle_ms})
        }
        // Exactly the fields the README lists for `stats` (with `sessions`); the
        // rest of `Stats` is for the Rust API and `radixd stat`.
        Ok(Reply::Stats { stats: s, sessions }) => json!({
            "ok": true,
            "total_tokens": s.total_tokens,
            "evictable_tokens": s.evictable_tokens,
            "protected_tokens": s.protected_tokens,
            "free_pages": s.free_pages,
            "nodes": s.nodes,
            "evict_scanned": s.evict_scanned,
            "sessions": sessions,
        }),
        Ok(Reply::MatchedWith {
            len,
            pages,
            handle,
            full_len,
            mamba_state,
        }) => {
            let mut v = json!({"ok": true, "len": len, "pages": pages, "handle": handle});
            v["full_kv_hit_length"] = json!(full_len);
            if mamba {
                v["mamba_state"] = json!(mamba_state);
            }
            v
        }
        Ok(Reply::InsertedWith {
            cached,
            len,
            handle,
            locked,
            mamba_exist,
        }) => {
            let mut v = json!({"ok": true, "cached": cached, "len": len});
            if locked {
                v["handle"] = json!(handle);
            }
            if mamba {
                v["mamba_exist"] = json!(mamba_exist);
            }
            v
        }
        Ok(Reply::EvictedComponents {
            tokens,
            swa_tokens,
            mamba_states,
        }) => json!({
            "ok": true,
            "evicted": tokens,
            "swa_evicted": swa_tokens,
            "mamba_evicted": mamba_states,
        }),
        Ok(Reply::State { state }) => json!({"ok": true, "state": state}),
        // Store writes reach `exec` only as its own store ops (`store`).
        Ok(Reply::Store(r)) => json!({"ok": true, "store": format!("{r:?}")}),
        Ok(Reply::Namespace { id }) => json!({"ok": true, "id": id}),
        Ok(Reply::SwaFreed { n }) => json!({"ok": true, "freed": n}),
        Ok(Reply::Bound { holders }) => json!({"ok": true, "holders": holders}),
        Ok(Reply::Joined { joined, size, .. }) => {
            json!({"ok": true, "joined": joined, "size": size})
        }
        Ok(Reply::SwaPages(pages)) => json!({"ok": true, "swa_pages": peers(&pages)}),
        // The hybrid step's paired answers: their fields, as the plain
        // answers name them.
        Ok(Reply::PagesPaired { pages, swa_pages }) => {
            json!({"ok": true, "pages": pages, "swa_pages": peers(&swa_pages)})
        }
        Ok(Reply::LockedPaired {
            lock,
            delta,
            swa_pages,
        }) => json!({"ok": true, "handle": lock, "delta": delta, "swa_pages": peers(&swa_pages)}),
        Ok(Reply::InsertedPaired {
            cached,
            len,
            handle,
            locked,
            mamba_exist,
            pages,
            swa_pages,
        }) => {
            let mut v = json!({"ok": true, "cached": cached, "len": len, "pages": pages});
            if locked {
                v["handle"] = json!(handle);
            }
            if mamba {
                v["mamba_exist"] = json!(mamba_exist);
            }
            if swa {
                v["swa_pages"] = json!(peers(&swa_pages));
            }
            v
        }
        Ok(Reply::States(states)) => json!({"ok": true, "states": states}),
        Ok(Reply::Counted { reply, free }) => {
            let mut v = value_for(Ok(*reply), components);
            v["free_pages"] = json!(free.pages);
            if swa {
                v["swa_free_pages"] = json!(free.swa_pages);
            }
            if mamba {
                v["mamba_free_states"] = json!(free.mamba_states);
            }
            v
        }
        Ok(Reply::StatsWith {
            stats: s,
            sessions,
            components: c,
        }) => {
            let mut v = json!({
                "ok": true,
                "total_tokens": s.total_tokens,
                "evictable_tokens": s.evictable_tokens,
                "protected_tokens": s.protected_tokens,
                "free_pages": s.free_pages,
                "nodes": s.nodes,
                "evict_scanned": s.evict_scanned,
                "sessions": sessions,
            });
            if let Some(c) = c {
                if swa {
                    v["swa_evictable_tokens"] = json!(c.swa_evictable_tokens);
                    v["swa_protected_tokens"] = json!(c.swa_protected_tokens);
                    v["swa_free_pages"] = json!(c.swa_free_pages);
                    v["evict_scanned_swa"] = json!(c.evict_scanned_swa);
                }
                if mamba {
                    v["mamba_evictable_states"] = json!(c.mamba_evictable_states);
                    v["mamba_protected_states"] = json!(c.mamba_protected_states);
                    v["mamba_free_states"] = json!(c.mamba_free_states);
                    v["evict_scanned_mamba"] = json!(c.evict_scanned_mamba);
                }
                v["components"] = json!(components.names());
            }
            v
        }
    }
}

/// SWA pages as answered (`u32::MAX`: none), `null` for none.
fn peers(pages: &[u32]) -> Vec<Value> {
    pages
        .iter()
        .map(|&p| if p == u32::MAX { Value::Null } else { json!(p) })
        .collect()
}
