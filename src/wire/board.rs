//! What a group's board carries (`radixd_ipc::Board`): the 128-bit
//! [`digest`] of a rank's encoded request, which the ranks compare step by
//! step, and a reply record as a step's six words. Apart because only
//! groups use it.

use super::payload::EncodedRequest;
use super::record::WireReply;

/// A 128-bit digest of an encoded request (its record's fields, bar the
/// sequence number and windows, and its payload): what a rank compares a
/// step on its group's board with (`radixd_ipc::Board`). Four lanes of a
/// multiply-rotate hash take every fourth word (so the multiplies run side
/// by side), folded by murmur3's finalizer into two words: two different
/// requests collide with odds of about 2^-128.
pub fn digest(e: &EncodedRequest<'_>) -> [u64; 2] {
    let mut d = Digest::new();
    let r = &e.record;
    d.word(u64::from(r.op) | u64::from(r.flags) << 32);
    d.word(r.arg);
    d.word(u64::from(r.n_tokens) | u64::from(r.n_pages) << 32);
    d.word(u64::from(r.aux[0]) | u64::from(r.aux[1]) << 32);
    d.word(u64::from(r.payload_len));
    d.u32s(e.tokens);
    d.u32s(e.pages);
    d.u32s(e.anchor_words.as_slice());
    for bytes in [e.session, &e.bytes[..], e.ns] {
        d.bytes(bytes);
    }
    d.finish()
}

/// The state of [`digest`].
struct Digest {
    h: [u64; 4],
    /// Words taken so far (which lane takes the next).
    n: usize,
}

impl Digest {
    const K: [u64; 4] = [
        0x9E37_79B9_7F4A_7C15,
        0xC2B2_AE3D_27D4_EB4F,
        0x1656_67B1_9E37_79F9,
        0xFF51_AFD7_ED55_8CCD,
    ];

    fn new() -> Self {
        Self {
            h: [
                0x243F_6A88_85A3_08D3,
                0x1319_8A2E_0370_7344,
                0xA409_3822_299F_31D0,
                0x082E_FA98_EC4E_6C89,
            ],
            n: 0,
        }
    }

    #[inline(always)]
    fn lane(&mut self, i: usize, w: u64) {
        self.h[i] = (self.h[i].rotate_left(23) ^ w).wrapping_mul(Self::K[i]);
    }

    fn word(&mut self, w: u64) {
        self.lane(self.n % 4, w);
        self.n += 1;
    }

    fn u32s(&mut self, xs: &[u32]) {
        let mut quads = xs.chunks_exact(8);
        // Four independent multiply chains, in registers; the lanes are
        // turned so that the word count decides which lane goes first.
        let turn = self.n % 4;
        let mut h = [0; 4];
        for (i, x) in h.iter_mut().enumerate() {
            *x = self.h[(turn + i) % 4];
        }
        let k: [u64; 4] = std::array::from_fn(|i| Self::K[(turn + i) % 4]);
        for q in &mut quads {
            for i in 0..4 {
                let w = u64::from(q[2 * i]) | u64::from(q[2 * i + 1]) << 32;
                h[i] = (h[i].rotate_left(23) ^ w).wrapping_mul(k[i]);
            }
        }
        for (i, x) in h.into_iter().enumerate() {
            self.h[(turn + i) % 4] = x;
        }
        self.n += 4 * (xs.len() / 8);
        let rest = quads.remainder();
        let mut pairs = rest.chunks_exact(2);
        for p in &mut pairs {
            self.word(u64::from(p[0]) | u64::from(p[1]) << 32);
        }
        if let [x] = pairs.remainder() {
            self.word(u64::from(*x) | 1 << 63);
        }
        self.word(xs.len() as u64);
    }

    fn bytes(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.word(u64::from_ne_bytes([
                c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7],
            ]));
        }
        let mut last = [0u8; 8];
        last[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
        self.word(u64::from_ne_bytes(last));
        self.word(bytes.len() as u64);
    }

    fn finish(self) -> [u64; 2] {
        // murmur3's 64-bit finalizer.
        let fmix = |mut k: u64| {
            k ^= k >> 33;
            k = k.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
            k ^= k >> 33;
            k = k.wrapping_mul(0xC4CE_B9FE_1A85_EC53);
            k ^ k >> 33
        };
        let [a, b, c, d] = self.h.map(fmix);
        [
            fmix(a ^ b.rotate_left(21) ^ c.rotate_left(42) ^ d.rotate_left(11)),
            fmix(b ^ c.rotate_left(19) ^ d.rotate_left(37) ^ a.rotate_left(53)),
        ]
    }
}

/// A reply record as the six words of a step on a board (its sequence
/// number left out: each rank's is its own).
pub fn reply_words(w: &WireReply) -> [u64; radixd_ipc::HEAD_WORDS] {
    [
        u64::from(w.status) | u64::from(w.kind) << 32,
        w.a,
        w.b,
        w.c,
        u64::from(w.payload_len) | u64::from(w.flags) << 32,
        u64::from_ne_bytes(w.inline),
    ]
}

/// The reply record of [`reply_words`], with sequence number `seq`.
pub fn reply_of_words(seq: u64, words: [u64; radixd_ipc::HEAD_WORDS]) -> WireReply {
    WireReply {
        seq,
        status: words[0] as u32,
        kind: (words[0] >> 32) as u32,
        a: words[1],
        b: words[2],
        c: words[3],
        payload_len: words[4] as u32,
        flags: (words[4] >> 32) as u32,
        inline: words[5].to_ne_bytes(),
    }
}
