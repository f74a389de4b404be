//! `radixd exec`: one JSON request per input line, one JSON answer per output
//! line, in order. A bad line gets an error answer and the stream goes on.

use std::io::{self, BufRead, Write};

use serde_json::{json, Map, Value};

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
    loop {
        line.clear();
        if input.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let answer = match parse(&line) {
            Ok(request) => render(backend.call(request)),
            Err(rejection) => render(Err(rejection)),
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

/// Parses one request line.
pub fn parse(line: &[u8]) -> Result<Request, Rejection> {
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
    let f = Fields(&obj);
    Ok(match op {
        "alloc" => Request::Alloc { n: f.u64("n")? },
        "free" => Request::Free { pages: f.pages()? },
        "insert" => Request::Insert {
            tokens: f.tokens()?,
            pages: f.pages()?,
            lock: f.flag("lock")?,
        },
        "match" => Request::Match {
            tokens: f.tokens()?,
            lock: f.flag("lock")?,
        },
        "lock" => Request::Lock {
            handle: f.u64("handle")?,
        },
        "unlock" => Request::Unlock {
            handle: f.u64("handle")?,
        },
        "evict" => Request::Evict {
            tokens: f.u64("tokens")?,
        },
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
        "stats" => Request::Stats,
        "reset" => Request::Reset,
        "validate" => Request::Validate,
        other => {
            return Err(Rejection::new(
                ErrorKind::UnknownOp,
                format!("unknown op {other:?}"),
            ))
        }
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

    fn session(&self) -> Result<String, Rejection> {
        match self.get("session")? {
            Value::String(s) => Ok(s.clone()),
            _ => Err(malformed("\"session\" must be a string")),
        }
    }
}

/// The answer line for a result.
pub fn render(result: Result<Reply, Rejection>) -> String {
    let value = match result {
        Err(r) => json!({"ok": false, "error": r.kind.name(), "message": r.message}),
        Ok(Reply::Pages(pages)) => json!({"ok": true, "pages": pages}),
        Ok(Reply::Done) => json!({"ok": true}),
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
    };
    value.to_string()
}
