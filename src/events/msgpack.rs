//! The little of MessagePack that vLLM's `EventBatch` needs: nil, booleans,
//! integers, float64, strings, binaries, arrays and maps. Integers and
//! lengths are written in their shortest form, as `msgspec` writes them.
//! The decoder bounds nesting and checks every length against the input.

use std::fmt;

/// Appends nil.
pub fn nil(out: &mut Vec<u8>) {
    out.push(0xc0);
}

/// Appends an unsigned integer.
pub fn uint(out: &mut Vec<u8>, n: u64) {
    if n < 0x80 {
        out.push(n as u8);
    } else if n <= 0xff {
        out.extend_from_slice(&[0xcc, n as u8]);
    } else if n <= 0xffff {
        out.push(0xcd);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else if n <= 0xffff_ffff {
        out.push(0xce);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    } else {
        out.push(0xcf);
        out.extend_from_slice(&n.to_be_bytes());
    }
}

/// Appends an array of `u32`s, each in its shortest form: the token lists,
/// the bulk of every payload, in one reservation.
pub fn u32_array(out: &mut Vec<u8>, items: &[u32]) {
    array(out, items.len());
    out.reserve(items.len() * 5);
    for &t in items {
        if t < 0x80 {
            out.push(t as u8);
        } else if t <= 0xff {
            out.extend_from_slice(&[0xcc, t as u8]);
        } else if t <= 0xffff {
            let [a, b] = (t as u16).to_be_bytes();
            out.extend_from_slice(&[0xcd, a, b]);
        } else {
            let [a, b, c, d] = t.to_be_bytes();
            out.extend_from_slice(&[0xce, a, b, c, d]);
        }
    }
}

/// Appends a float64.
pub fn float(out: &mut Vec<u8>, x: f64) {
    out.push(0xcb);
    out.extend_from_slice(&x.to_bits().to_be_bytes());
}

/// Appends a UTF-8 string.
pub fn str(out: &mut Vec<u8>, s: &str) {
    let n = s.len();
    if n < 32 {
        out.push(0xa0 | n as u8);
    } else if n <= 0xff {
        out.extend_from_slice(&[0xd9, n as u8]);
    } else if n <= 0xffff {
        out.push(0xda);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(0xdb);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
    out.extend_from_slice(s.as_bytes());
}

/// Appends the head of an array of `n` items.
pub fn array(out: &mut Vec<u8>, n: usize) {
    container(out, n, [0x90, 0xdc, 0xdd]);
}

/// Appends the head of a map of `n` pairs.
pub fn map(out: &mut Vec<u8>, n: usize) {
    container(out, n, [0x80, 0xde, 0xdf]);
}

/// Appends the head of a container of `n` entries; `markers` are its
/// fix, 16-bit and 32-bit forms.
fn container(out: &mut Vec<u8>, n: usize, [fix, m16, m32]: [u8; 3]) {
    if n < 16 {
        out.push(fix | n as u8);
    } else if n <= 0xffff {
        out.push(m16);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(m32);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
}

/// Writes `true` or `false`.
pub fn boolean(out: &mut Vec<u8>, b: bool) {
    out.push(if b { 0xc3 } else { 0xc2 });
}

/// Writes any [`Value`] (integers in their shortest form).
pub fn encode(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::Nil => nil(out),
        Value::Bool(b) => boolean(out, *b),
        Value::Int(i) if *i >= 0 => uint(out, *i as u64),
        Value::Int(i) => {
            out.push(0xd3);
            out.extend_from_slice(&i.to_be_bytes());
        }
        Value::UInt(u) => uint(out, *u),
        Value::Float(x) => float(out, *x),
        Value::Str(s) => str(out, s),
        Value::Bin(b) => {
            let n = b.len();
            if n <= 0xff {
                out.extend_from_slice(&[0xc4, n as u8]);
            } else if n <= 0xffff {
                out.push(0xc5);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            } else {
                out.push(0xc6);
                out.extend_from_slice(&(n as u32).to_be_bytes());
            }
            out.extend_from_slice(b);
        }
        Value::Array(items) => {
            array(out, items.len());
            for x in items {
                encode(out, x);
            }
        }
        Value::Map(pairs) => {
            map(out, pairs.len());
            for (k, x) in pairs {
                encode(out, k);
                encode(out, x);
            }
        }
    }
}

/// A decoded MessagePack value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `nil`.
    Nil,
    /// `true` or `false`.
    Bool(bool),
    /// Any integer that fits an `i64`.
    Int(i64),
    /// A positive integer above `i64::MAX`.
    UInt(u64),
    /// A float32 (widened) or float64.
    Float(f64),
    /// A UTF-8 string.
    Str(String),
    /// A byte string.
    Bin(Vec<u8>),
    /// An array.
    Array(Vec<Value>),
    /// A map, its pairs in order.
    Map(Vec<(Value, Value)>),
}

impl Value {
    /// The value as a `u64`, if it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Self::Int(i) => u64::try_from(i).ok(),
            Self::UInt(u) => Some(u),
            _ => None,
        }
    }
}

/// Why bytes are not the MessagePack expected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// The input ends inside a value.
    Truncated,
    /// A type byte this decoder does not read (ext, timestamp).
    Unsupported(u8),
    /// Arrays or maps nested deeper than [`MAX_DEPTH`].
    TooDeep,
    /// A string that is not UTF-8.
    BadUtf8,
    /// Bytes left over after the value.
    Trailing(usize),
    /// A well-formed value of the wrong shape (what was expected).
    Shape(&'static str),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated => write!(f, "msgpack input ends inside a value"),
            Self::Unsupported(b) => write!(f, "unsupported msgpack type byte 0x{b:02x}"),
            Self::TooDeep => write!(f, "msgpack nested deeper than {MAX_DEPTH}"),
            Self::BadUtf8 => write!(f, "msgpack string is not UTF-8"),
            Self::Trailing(n) => write!(f, "{n} bytes after the msgpack value"),
            Self::Shape(what) => write!(f, "unexpected msgpack shape: expected {what}"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Deepest nesting the decoder follows.
pub const MAX_DEPTH: usize = 16;

/// Decodes exactly one value filling `bytes`.
pub fn decode(bytes: &[u8]) -> Result<Value, DecodeError> {
    let mut r = Reader { bytes, at: 0 };
    let v = r.value(0)?;
    match bytes.len() - r.at {
        0 => Ok(v),
        n => Err(DecodeError::Trailing(n)),
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.at.checked_add(n).ok_or(DecodeError::Truncated)?;
        let s = self.bytes.get(self.at..end).ok_or(DecodeError::Truncated)?;
        self.at = end;
        Ok(s)
    }

    fn be(&mut self, n: usize) -> Result<u64, DecodeError> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }

    fn value(&mut self, depth: usize) -> Result<Value, DecodeError> {
        if depth > MAX_DEPTH {
            return Err(DecodeError::TooDeep);
        }
        let b = self.take(1)?[0];
        Ok(match b {
            0x00..=0x7f => Value::Int(i64::from(b)),
            0x80..=0x8f => self.map(usize::from(b & 0x0f), depth)?,
            0x90..=0x9f => self.array(usize::from(b & 0x0f), depth)?,
            0xa0..=0xbf => self.string(usize::from(b & 0x1f))?,
            0xc0 => Value::Nil,
            0xc2 => Value::Bool(false),
            0xc3 => Value::Bool(true),
            0xca => Value::Float(f64::from(f32::from_bits(self.be(4)? as u32))),
            0xcb => Value::Float(f64::from_bits(self.be(8)?)),
            0xcc => Value::Int(self.be(1)? as i64),
            0xcd => Value::Int(self.be(2)? as i64),
            0xce => Value::Int(self.be(4)? as i64),
            0xcf => {
                let u = self.be(8)?;
                i64::try_from(u).map_or(Value::UInt(u), Value::Int)
            }
            0xd0 => Value::Int(i64::from(self.be(1)? as u8 as i8)),
            0xd1 => Value::Int(i64::from(self.be(2)? as u16 as i16)),
            0xd2 => Value::Int(i64::from(self.be(4)? as u32 as i32)),
            0xd3 => Value::Int(self.be(8)? as i64),
            // bin, str, array and map with a big-endian length.
            0xc4..=0xc6 | 0xd9..=0xdf => {
                let width = match b {
                    0xc4 | 0xd9 => 1,
                    0xc5 | 0xda | 0xdc | 0xde => 2,
                    _ => 4,
                };
                let n = self.be(width)? as usize;
                match b {
                    0xc4..=0xc6 => Value::Bin(self.take(n)?.to_vec()),
                    0xd9..=0xdb => self.string(n)?,
                    0xdc | 0xdd => self.array(n, depth)?,
                    _ => self.map(n, depth)?,
                }
            }
            0xe0..=0xff => Value::Int(i64::from(b as i8)),
            other => return Err(DecodeError::Unsupported(other)),
        })
    }

    fn string(&mut self, n: usize) -> Result<Value, DecodeError> {
        let s = self.take(n)?;
        std::str::from_utf8(s)
            .map(|s| Value::Str(s.to_owned()))
            .map_err(|_| DecodeError::BadUtf8)
    }

    fn array(&mut self, n: usize, depth: usize) -> Result<Value, DecodeError> {
        // Every item takes at least a byte: a count beyond what is left is
        // a lie, and must not size an allocation.
        if n > self.bytes.len() - self.at {
            return Err(DecodeError::Truncated);
        }
        let mut items = Vec::with_capacity(n);
        for _ in 0..n {
            items.push(self.value(depth + 1)?);
        }
        Ok(Value::Array(items))
    }

    fn map(&mut self, n: usize, depth: usize) -> Result<Value, DecodeError> {
        if n > (self.bytes.len() - self.at) / 2 {
            return Err(DecodeError::Truncated);
        }
        let mut items = Vec::with_capacity(n);
        for _ in 0..n {
            let k = self.value(depth + 1)?;
            let v = self.value(depth + 1)?;
            items.push((k, v));
        }
        Ok(Value::Map(items))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_shortest_forms() {
        let mut b = Vec::new();
        array(&mut b, 6);
        nil(&mut b);
        uint(&mut b, 127);
        uint(&mut b, u64::MAX);
        float(&mut b, 1.5);
        str(&mut b, "GPU");
        array(&mut b, 20);
        for i in 0..20 {
            uint(&mut b, i * 1000);
        }
        let v = decode(&b).unwrap();
        let Value::Array(items) = v else {
            panic!("not an array")
        };
        assert_eq!(items[0], Value::Nil);
        assert_eq!(items[1], Value::Int(127));
        assert_eq!(items[2], Value::UInt(u64::MAX));
        assert_eq!(items[3], Value::Float(1.5));
        assert_eq!(items[4], Value::Str("GPU".into()));
        assert_eq!(b[1..3], [0xc0, 0x7f]);
    }

    #[test]
    fn any_value_round_trips() {
        let v = Value::Map(vec![
            (
                Value::Str("a".into()),
                Value::Array(vec![Value::Int(-5), Value::UInt(1 << 40)]),
            ),
            (Value::Str("b".into()), Value::Bool(true)),
            (Value::Nil, Value::Bin(vec![1, 2, 3])),
            (Value::Float(0.5), Value::Str("x".repeat(300))),
        ]);
        let mut out = Vec::new();
        encode(&mut out, &v);
        let back = decode(&out).unwrap();
        // Non-negative integers decode as the decoder's integer form.
        let mut again = Vec::new();
        encode(&mut again, &back);
        assert_eq!(out, again);
    }

    #[test]
    fn rejects_lies() {
        assert_eq!(
            decode(&[0xdd, 0xff, 0xff, 0xff, 0xff]),
            Err(DecodeError::Truncated)
        );
        assert_eq!(decode(&[0x91]), Err(DecodeError::Truncated));
        assert_eq!(decode(&[0xc0, 0xc0]), Err(DecodeError::Trailing(1)));
        assert_eq!(decode(&[0x91; 40]), Err(DecodeError::TooDeep));
    }
}
