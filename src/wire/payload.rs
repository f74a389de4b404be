//! Where a message's variable-size payload lies and how it is copied: the
//! [`Payload`] a decoder reads piece by piece (a private buffer, a window of
//! a client's scratch area, a prefix of either) and the host-order word
//! copies both directions use. Apart from the codecs because it is about
//! where bytes are, not what they mean.

use radixd_ipc::{copy, Scratch, ScratchError};

use super::malformed;
use super::record::{WireRequest, FLAG_COUNTED, FREE_BYTES};
use crate::op::Rejection;

/// A request's payload window in a client's scratch area, checked to lie
/// inside it; [`decode_request`](super::decode_request) copies each piece
/// out once.
pub struct ScratchWindow<'a> {
    scratch: &'a Scratch<'a>,
    at: u64,
    len: usize,
}

impl<'a> ScratchWindow<'a> {
    /// The `len` bytes at `at`, or why they are not all inside `scratch`.
    pub fn new(scratch: &'a Scratch<'a>, at: u32, len: u32) -> Result<Self, ScratchError> {
        scratch.contains(u64::from(at), u64::from(len))?;
        Ok(Self {
            scratch,
            at: u64::from(at),
            len: len as usize,
        })
    }
}

impl ScratchWindow<'_> {
    /// The scratch offset of `len` bytes at `at` within the window.
    fn piece(&self, at: usize, len: Option<usize>) -> Result<u64, Rejection> {
        match len.and_then(|len| at.checked_add(len)) {
            Some(end) if end <= self.len => Ok(self.at + at as u64),
            _ => Err(malformed("payload piece out of range")),
        }
    }
}

impl Payload for ScratchWindow<'_> {
    fn len(&self) -> usize {
        self.len
    }

    fn words(&self, at: usize, n: usize, out: &mut Vec<u32>) -> Result<(), Rejection> {
        let from = self.piece(at, n.checked_mul(4))?;
        self.scratch
            .read_u32s(from, n as u64, out)
            .map_err(|e| malformed(format!("payload window: {e}")))
    }

    fn bytes(&self, at: usize, n: usize) -> Result<Vec<u8>, Rejection> {
        let from = self.piece(at, Some(n))?;
        let mut out = Vec::new();
        self.scratch
            .read_bytes(from, n as u64, &mut out)
            .map_err(|e| malformed(format!("payload window: {e}")))?;
        Ok(out)
    }
}

/// Where [`decode_request`](super::decode_request) reads a payload from: a
/// private buffer, or a window of shared memory. Each piece is read exactly
/// once, after the record (a private copy) has been checked against
/// [`Payload::len`], so a peer writing the window meanwhile can garble
/// values but never lengths.
pub trait Payload {
    /// Bytes in the window.
    fn len(&self) -> usize;
    /// Whether the window is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copies out `n` words at byte `at` into `out` (replacing what it
    /// held); `at + 4n <= len()`.
    fn words(&self, at: usize, n: usize, out: &mut Vec<u32>) -> Result<(), Rejection>;
    /// Copies out `n` bytes at byte `at`; `at + n <= len()`.
    fn bytes(&self, at: usize, n: usize) -> Result<Vec<u8>, Rejection>;
}

impl Payload for [u8] {
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }

    fn words(&self, at: usize, n: usize, out: &mut Vec<u32>) -> Result<(), Rejection> {
        let bytes = n
            .checked_mul(4)
            .and_then(|len| self.get(at..at.checked_add(len)?))
            .ok_or_else(|| malformed("payload piece out of range"))?;
        out.clear();
        out.extend(
            bytes
                .chunks_exact(4)
                .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]])),
        );
        Ok(())
    }

    fn bytes(&self, at: usize, n: usize) -> Result<Vec<u8>, Rejection> {
        at.checked_add(n)
            .and_then(|end| self.get(at..end))
            .map(copy::to_vec)
            .ok_or_else(|| malformed("payload piece out of range"))
    }
}

/// The first `len` bytes of a payload.
pub(super) struct Prefix<'p, P: ?Sized> {
    pub(super) payload: &'p P,
    pub(super) len: usize,
}

impl<P: Payload + ?Sized> Payload for Prefix<'_, P> {
    fn len(&self) -> usize {
        self.len
    }

    fn words(&self, at: usize, n: usize, out: &mut Vec<u32>) -> Result<(), Rejection> {
        match n.checked_mul(4).and_then(|b| b.checked_add(at)) {
            Some(end) if end <= self.len => self.payload.words(at, n, out),
            _ => Err(malformed("payload piece out of range")),
        }
    }

    fn bytes(&self, at: usize, n: usize) -> Result<Vec<u8>, Rejection> {
        match at.checked_add(n) {
            Some(end) if end <= self.len => self.payload.bytes(at, n),
            _ => Err(malformed("payload piece out of range")),
        }
    }
}

/// Appends `xs` in host byte order, in chunks that stay clear of the slow large
/// copy (see [`radixd_ipc::copy`]).
pub(super) fn push_u32s(out: &mut Vec<u8>, xs: &[u32]) {
    const WORDS: usize = copy::CHUNK / 4;
    let start = out.len();
    out.resize(start + xs.len() * 4, 0);
    for (bytes, words) in out[start..].chunks_mut(copy::CHUNK).zip(xs.chunks(WORDS)) {
        for (b, x) in bytes.chunks_exact_mut(4).zip(words) {
            b.copy_from_slice(&x.to_ne_bytes());
        }
    }
}

/// The words of `bytes` (host byte order) (whose length is a multiple of 4).
pub(super) fn u32s(bytes: &[u8]) -> Vec<u32> {
    const WORDS: usize = copy::CHUNK / 4;
    let mut out = vec![0; bytes.len() / 4];
    for (words, chunk) in out.chunks_mut(WORDS).zip(bytes.chunks(copy::CHUNK)) {
        for (x, b) in words.iter_mut().zip(chunk.chunks_exact(4)) {
            *x = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
        }
    }
    out
}

/// A request record and the pieces of its payload, borrowed from the
/// request, ready to be copied into a scratch window (or a byte stream).
pub struct EncodedRequest<'r> {
    pub record: WireRequest,
    /// Bytes of reply window the answer can need.
    pub reply_need: usize,
    pub tokens: &'r [u32],
    pub pages: &'r [u32],
    /// The words after the pages of the anchored and component ops (see
    /// [`WireRequest`]).
    pub anchor_words: AnchorWords,
    pub session: &'r [u8],
    /// An owned payload after all of the above (store requests).
    pub bytes: Vec<u8>,
    /// The namespace's name of a namespaced request (else empty): last.
    pub ns: &'r [u8],
}

/// Up to four words of a request's payload after its pages (anchored
/// and component ops).
#[derive(Clone, Copy, Debug, Default)]
pub struct AnchorWords {
    pub(super) words: [u32; 4],
    pub(super) len: usize,
}

impl AnchorWords {
    /// The words.
    pub fn as_slice(&self) -> &[u32] {
        &self.words[..self.len]
    }
}

impl EncodedRequest<'_> {
    /// This request counted ([`Request::Counted`](crate::op::Request::Counted)):
    /// flagged, its answer carrying the pools' free counts after its own
    /// (room for them added). What takes no count the daemon's decoder
    /// refuses.
    pub fn counted(mut self) -> Self {
        self.record.flags |= FLAG_COUNTED;
        self.reply_need += FREE_BYTES;
        self
    }

    /// Payload bytes: `tokens ++ pages ++ anchor words ++ session ++ ns`.
    pub fn payload_len(&self) -> usize {
        (self.tokens.len() + self.pages.len() + self.anchor_words.len) * 4
            + self.session.len()
            + self.bytes.len()
            + self.ns.len()
    }

    /// The payload as one buffer, for transports that need one.
    pub fn payload(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.payload_len());
        push_u32s(&mut out, self.tokens);
        push_u32s(&mut out, self.pages);
        push_u32s(&mut out, self.anchor_words.as_slice());
        out.extend_from_slice(self.session);
        out.extend_from_slice(&self.bytes);
        out.extend_from_slice(self.ns);
        out
    }
}
