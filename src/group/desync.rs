//! What an out-of-step error says: a request in a few words
//! ([`describe`]), what first differs between two ranks' calls
//! ([`first_difference`]), and the clipping that keeps such a message
//! within a reply window. Apart from the group's bookkeeping: only the
//! wording of a desync changes here.

use std::fmt::Write as _;

use crate::engine::InsertHints;
use crate::op::Request;

/// Bytes of a name (group key, session id, namespace) a message quotes.
const CLIP: usize = 48;

/// `name` quoted (escaped as `{:?}` does), cut to [`CLIP`] bytes with
/// `...` when longer: a message stays short whatever the names.
pub(super) fn clipped(name: &str) -> String {
    let quoted = format!("{name:?}");
    if quoted.len() <= CLIP {
        return quoted;
    }
    let mut end = CLIP;
    while !quoted.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &quoted[..end])
}

/// `message` cut to the room every reply window has for one
/// ([`crate::wire::MIN_REPLY_WINDOW`]), ending with `...` when cut: what a
/// message puts first is what the wire carries, never cut by it.
pub(super) fn fitted(mut message: String) -> String {
    let room = crate::wire::MIN_REPLY_WINDOW;
    if message.len() > room {
        let mut end = room - 3;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push_str("...");
    }
    message
}

/// The key, the pages and whether a lock is asked, of the requests that
/// carry them.
fn parts(request: &Request) -> (Option<&[u32]>, Option<&[u32]>, Option<bool>) {
    match request {
        Request::Insert {
            tokens,
            pages,
            lock,
        }
        | Request::InsertWith {
            tokens,
            pages,
            lock,
            ..
        }
        | Request::InsertPaired {
            tokens,
            pages,
            lock,
            ..
        } => (Some(tokens), Some(pages), Some(*lock)),
        Request::SessionCommit { tokens, pages, .. } => (Some(tokens), Some(pages), None),
        Request::Match { tokens, lock } | Request::MatchWith { tokens, lock } => {
            (Some(tokens), None, Some(*lock))
        }
        Request::Walk { tokens } => (Some(tokens), None, None),
        Request::Free { pages }
        | Request::FreeSwa { pages }
        | Request::SwaPages { pages }
        | Request::LockPaired { pages, .. }
        | Request::FreeStates { states: pages } => (None, Some(pages), None),
        _ => (None, None, None),
    }
}

/// Where two lists first differ, as `the {what} first differ at {item} i
/// (from 0): x here, y at rank {leader}`, or where one ends.
fn first_position(what: &str, item: &str, ours: &[u32], led: &[u32], leader: u32) -> String {
    match ours.iter().zip(led).position(|(a, b)| a != b) {
        Some(i) => format!(
            "the {what} first differ at {item} {i} (from 0): {} here, {} at rank {leader}",
            ours[i], led[i]
        ),
        None => format!(
            "the {what} agree on their first {} {item}s, then one ends: {} {item}s here, {} at rank {leader}",
            ours.len().min(led.len()),
            ours.len(),
            led.len()
        ),
    }
}

/// What first differs between `ours`, a rank's call, and `led`, the call
/// rank `leader` made at the same step: the namespace, the op, the first
/// token position of the key, the first page, the lock, in that order,
/// else the other arguments. Two keys of one length that differ at token
/// 9 read the same in [`describe`]; here they do not.
pub fn first_difference(ours: &Request, led: &Request, leader: u32) -> String {
    fn unwrap(r: &Request) -> (bool, Option<&str>, &Request) {
        let (counted, r) = match r {
            Request::Counted(request) => (true, &**request),
            r => (false, r),
        };
        match r {
            Request::Namespaced { ns, request } => (counted, Some(ns.as_str()), &**request),
            r => (counted, None, r),
        }
    }
    // Hints sit inside a namespace (see `Request::Hinted`).
    fn hints(r: &Request) -> (Option<InsertHints>, &Request) {
        match r {
            Request::Hinted { hints, request } => (Some(*hints), &**request),
            r => (None, r),
        }
    }
    let ((counted, ns, ours), (led_counted, led_ns, led)) = (unwrap(ours), unwrap(led));
    let ((hinted, ours), (led_hinted, led)) = (hints(ours), hints(led));
    if ns != led_ns {
        let shown = |ns: Option<&str>| ns.map_or_else(|| "none".to_owned(), clipped);
        return format!(
            "the namespaces differ: {} here, {} at rank {leader}",
            shown(ns),
            shown(led_ns)
        );
    }
    if counted != led_counted {
        let said = |c: bool| if c { "counted" } else { "not counted" };
        return format!(
            "another form of {} than rank {leader}'s: {} here, {} there",
            ours.name(),
            said(counted),
            said(led_counted)
        );
    }
    if hinted != led_hinted {
        let shown = |h: Option<InsertHints>| {
            let h = h.unwrap_or_default();
            format!("priority {}, inserted_len {}", h.priority, h.inserted_len)
        };
        return format!(
            "the insert hints differ: {} here, {} at rank {leader}",
            shown(hinted),
            shown(led_hinted)
        );
    }
    if std::mem::discriminant(ours) != std::mem::discriminant(led) {
        return if ours.name() == led.name() {
            format!("another form of {} than rank {leader}'s", ours.name())
        } else {
            format!(
                "another op: {} here, {} at rank {leader}",
                ours.name(),
                led.name()
            )
        };
    }
    let ((key, pages, lock), (led_key, led_pages, led_lock)) = (parts(ours), parts(led));
    if let (Some(a), Some(b)) = (key, led_key) {
        if a != b {
            return first_position("keys", "token", a, b, leader);
        }
    }
    if let (Some(a), Some(b)) = (pages, led_pages) {
        if a != b {
            return first_position("pages", "page", a, b, leader);
        }
    }
    if lock != led_lock {
        let asks = |l: Option<bool>| {
            if l == Some(true) {
                "locks"
            } else {
                "does not lock"
            }
        };
        return format!(
            "the same key, but this call {} and rank {leader}'s {}",
            asks(lock),
            asks(led_lock)
        );
    }
    let same = if key.is_some() {
        "the same op and key"
    } else {
        "the same op"
    };
    format!("{same} as rank {leader}'s, other arguments")
}

/// A request in a few words, for an out-of-step error: its op and sizes,
/// and the first tokens of its key.
pub fn describe(request: &Request) -> String {
    let key = |tokens: &[u32]| {
        let mut s = format!("{} tokens [", tokens.len());
        for (i, t) in tokens.iter().take(4).enumerate() {
            let _ = write!(s, "{}{t}", if i > 0 { ", " } else { "" });
        }
        s.push_str(if tokens.len() > 4 { ", ...]" } else { "]" });
        s
    };
    let lock = |l: &bool| if *l { " locking" } else { "" };
    match request {
        Request::Alloc { n } => format!("alloc of {n} pages"),
        Request::Free { pages } => format!("free of {} pages", pages.len()),
        Request::Insert {
            tokens,
            pages,
            lock: l,
        }
        | Request::InsertWith {
            tokens,
            pages,
            lock: l,
            ..
        } => format!(
            "insert{} of {} with {} pages",
            lock(l),
            key(tokens),
            pages.len()
        ),
        Request::Match { tokens, lock: l } | Request::MatchWith { tokens, lock: l } => {
            format!("match{} of {}", lock(l), key(tokens))
        }
        Request::Walk { tokens } => format!("walk of {}", key(tokens)),
        Request::Lock { handle } => format!("lock of {handle:#x}"),
        Request::Unlock { handle } => format!("unlock of {handle:#x}"),
        Request::Evict { tokens } => format!("evict of {tokens} tokens"),
        Request::EvictLeaf => "evict_leaf".to_owned(),
        Request::EvictComponents {
            tokens,
            swa_tokens,
            mamba_states,
        } => format!("evict of {tokens} tokens, {swa_tokens} SWA tokens, {mamba_states} states"),
        Request::SessionCommit {
            session, tokens, ..
        } => format!(
            "session_commit of {} with {}",
            clipped(session),
            key(tokens)
        ),
        Request::SessionRelease { session } => format!("session_release of {}", clipped(session)),
        Request::SessionStatus { session } => format!("session_status of {}", clipped(session)),
        Request::Namespaced { ns, request } => {
            format!("{} in namespace {}", describe(request), clipped(ns))
        }
        Request::AllocPaired { n } => format!("alloc_paired of {n} pages"),
        Request::LockPaired { handle, pages } => {
            format!("lock_paired of {handle:#x} with {} pages", pages.len())
        }
        Request::InsertPaired {
            tokens,
            pages,
            lock: l,
            tail,
            ..
        } => format!(
            "insert_paired{} of {} with {} pages, tail {tail}",
            lock(l),
            key(tokens),
            pages.len()
        ),
        Request::AllocStates { n } => format!("alloc_states of {n}"),
        Request::FreeStates { states } => format!("free_states of {} states", states.len()),
        Request::Counted(request) => format!("{}, counted", describe(request)),
        Request::Hinted { hints, request } => format!(
            "{} with priority {} and inserted_len {}",
            describe(request),
            hints.priority,
            hints.inserted_len
        ),
        other => other.name().to_owned(),
    }
}
