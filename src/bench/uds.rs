//! The baseline a user would otherwise write: the same engine behind a
//! mutex, served over a Unix domain socket, one thread per connection, with
//! the same request and reply records as the shared-memory path
//! (length-prefixed frames: record, then payload).

use std::io::{self, BufReader, BufWriter, Read, Write};
use std::mem::size_of;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::engine::{Config, Engine};
use crate::op::Backend;
use crate::op::{self, ErrorKind, Rejection, Reply, Request};
use crate::wire::{self, WireReply, WireRequest};

/// Largest frame accepted (a 1M-token prompt and its pages fit).
const MAX_FRAME: usize = 16 << 20;

fn to_bytes<T: radixd_ipc::Plain>(value: &T) -> Vec<u8> {
    let mut out = vec![0u8; size_of::<T>()];
    // SAFETY: `T: Plain` is plain integers without padding; copying its
    // bytes into a buffer of exactly its size reads nothing uninitialised.
    unsafe {
        std::ptr::copy_nonoverlapping(
            (value as *const T).cast::<u8>(),
            out.as_mut_ptr(),
            out.len(),
        )
    };
    out
}

fn from_bytes<T: radixd_ipc::Plain + Default>(bytes: &[u8]) -> Option<T> {
    let mut value = T::default();
    if bytes.len() != size_of::<T>() {
        return None;
    }
    // SAFETY: exactly `size_of::<T>()` bytes, and every bit pattern is a
    // valid `T` (`Plain`).
    unsafe {
        std::ptr::copy_nonoverlapping(
            bytes.as_ptr(),
            (&mut value as *mut T).cast::<u8>(),
            bytes.len(),
        )
    };
    Some(value)
}

/// Bytes of a record at the start of every frame (requests and replies
/// are the same size).
const RECORD: usize = size_of::<WireRequest>();
const _: () = assert!(size_of::<WireReply>() == RECORD);

fn write_frame(w: &mut impl Write, record: &[u8], payload: &[u8]) -> io::Result<()> {
    let len = (record.len() + payload.len()) as u32;
    w.write_all(&len.to_le_bytes())?;
    w.write_all(record)?;
    w.write_all(payload)?;
    w.flush()
}

fn read_frame(r: &mut impl Read, buf: &mut Vec<u8>) -> io::Result<()> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if !(RECORD..=MAX_FRAME).contains(&len) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes"),
        ));
    }
    buf.resize(len, 0);
    r.read_exact(buf)
}

/// A Unix-socket server for one engine; stops when dropped (its socket
/// file is removed; connection threads end with their clients).
pub struct UdsServer {
    path: PathBuf,
}

impl UdsServer {
    /// Serves a fresh engine of `config` at `path`.
    pub fn start(path: &Path, config: Config) -> io::Result<Self> {
        let engine = Engine::new(config)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)?;
        let engine = Arc::new(Mutex::new(engine));
        std::thread::spawn(move || {
            for (client, stream) in listener.incoming().enumerate() {
                let Ok(stream) = stream else { break };
                let engine = Arc::clone(&engine);
                std::thread::spawn(move || serve(stream, client as u32, &engine));
            }
        });
        Ok(Self {
            path: path.to_owned(),
        })
    }
}

impl Drop for UdsServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn serve(stream: UnixStream, client: u32, engine: &Mutex<Engine>) {
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let mut writer = BufWriter::new(stream);
    let (mut buf, mut out, mut spare) = (Vec::new(), Vec::new(), op::Spare::default());
    while read_frame(&mut reader, &mut buf).is_ok() {
        let (head, payload) = buf.split_at(RECORD);
        let result = match from_bytes::<WireRequest>(head) {
            None => Err(Rejection::new(ErrorKind::Malformed, "short record")),
            Some(mut record) => {
                record.payload_len = payload.len() as u32;
                wire::decode_request(&record, payload, &mut spare).and_then(|request| {
                    let mut engine = engine.lock().unwrap_or_else(|p| p.into_inner());
                    op::apply_with(&mut engine, client, request, &mut spare)
                })
            }
        };
        let seq = from_bytes::<WireRequest>(head).map_or(0, |r| r.seq);
        let reply = wire::encode_reply(seq, &result, usize::MAX, &mut out);
        spare.keep_reply(result);
        if write_frame(&mut writer, &to_bytes(&reply), &out).is_err() {
            break;
        }
    }
    let mut engine = engine.lock().unwrap_or_else(|p| p.into_inner());
    engine.release_client(client);
}

/// A client of a [`UdsServer`].
pub struct UdsClient {
    reader: BufReader<UnixStream>,
    writer: BufWriter<UnixStream>,
    page_size: u32,
    capacity: u32,
    buf: Vec<u8>,
}

impl UdsClient {
    /// Connects to the server at `path` serving an engine of `config`.
    pub fn connect(path: &Path, config: Config) -> io::Result<Self> {
        let stream = UnixStream::connect(path)?;
        Ok(Self {
            reader: BufReader::new(stream.try_clone()?),
            writer: BufWriter::new(stream),
            page_size: config.page_size,
            capacity: config.capacity,
            buf: Vec::new(),
        })
    }
}

impl Backend for UdsClient {
    fn call(&mut self, request: Request) -> Result<Reply, Rejection> {
        let e = wire::encode_request(&request, self.page_size, self.capacity);
        let gone = |e: io::Error| Rejection::new(ErrorKind::DaemonGone, e.to_string());
        write_frame(&mut self.writer, &to_bytes(&e.record), &e.payload()).map_err(gone)?;
        read_frame(&mut self.reader, &mut self.buf).map_err(gone)?;
        let (head, payload) = self.buf.split_at(RECORD);
        let reply: WireReply =
            from_bytes(head).ok_or_else(|| Rejection::new(ErrorKind::Protocol, "short reply"))?;
        wire::decode_reply(&reply, payload)
            .map_err(|e| Rejection::new(ErrorKind::Protocol, e.to_string()))?
    }
}
