//! The one error type of the replay subcommand.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// Everything that can make `radixd replay` fail. The CLI exits with status 2
/// on any of these.
#[derive(Debug)]
pub enum ReplayError {
    /// Reading the trace or writing an output failed.
    Io {
        /// What was being done, e.g. "reading trace foo.jsonl".
        context: String,
        /// The underlying error.
        source: io::Error,
    },
    /// A trace line is not a valid request object.
    Parse {
        /// 1-based line number in the trace file.
        line: usize,
        /// What serde reported about the line.
        message: String,
    },
    /// A capacity of zero blocks was requested.
    ZeroCapacity,
    /// A capacity too large for the 32-bit node indices of the replay caches.
    CapacityTooLarge {
        /// The requested capacity in blocks.
        capacity: usize,
        /// The largest accepted capacity.
        max: usize,
    },
    /// The block size was zero.
    ZeroBlockSize,
    /// S3-FIFO needs a small queue of at least one block.
    SmallQueueTooSmall {
        /// The requested capacity in blocks.
        capacity: usize,
        /// `round(capacity * 0.1)`, half to even.
        small_cap: usize,
    },
    /// A policy name that is not one of the known policies.
    UnknownPolicy {
        /// The name as given.
        name: String,
    },
    /// `--policy` or `--capacity` was empty.
    EmptyList {
        /// The flag, e.g. "--policy".
        flag: &'static str,
    },
    /// `--per-request` needs exactly one policy and one capacity.
    PerRequestNeedsSingleRun {
        /// Number of policies given.
        policies: usize,
        /// Number of capacities given.
        capacities: usize,
    },
    /// The `radix` policy's engine could not be built at this capacity
    /// (for example, not enough memory for it).
    Engine(crate::engine::ConfigError),
    /// `--components` and its companions do not make a configuration.
    Components(String),
    /// Drawing the plot failed.
    Plot {
        /// The plot file.
        path: PathBuf,
        /// What plotters reported.
        message: String,
    },
}

impl fmt::Display for ReplayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io { context, source } => write!(f, "{context}: {source}"),
            Self::Parse { line, message } => {
                write!(f, "malformed trace line {line}: {message}")
            }
            Self::ZeroCapacity => write!(f, "capacity must be at least 1 block, got 0"),
            Self::CapacityTooLarge { capacity, max } => {
                write!(f, "capacity {capacity} blocks exceeds the maximum of {max}")
            }
            Self::ZeroBlockSize => write!(f, "block size must be at least 1 token, got 0"),
            Self::Engine(e) => write!(f, "radix policy: {e}"),
            Self::Components(e) => write!(f, "radix policy: {e}"),
            Self::SmallQueueTooSmall {
                capacity,
                small_cap,
            } => write!(
                f,
                "s3fifo needs a small queue of at least 1 block, but capacity {capacity} gives \
                 round({capacity} * 0.1) = {small_cap}; use a capacity of at least 6"
            ),
            Self::UnknownPolicy { name } => write!(
                f,
                "unknown policy {name:?}; expected one of lru, lfu, s3fifo, radix"
            ),
            Self::EmptyList { flag } => write!(f, "{flag} needs at least one value"),
            Self::PerRequestNeedsSingleRun {
                policies,
                capacities,
            } => write!(
                f,
                "--per-request needs exactly one policy and one capacity, got {policies} \
                 policies and {capacities} capacities"
            ),
            Self::Plot { path, message } => {
                write!(f, "drawing plot {}: {message}", path.display())
            }
        }
    }
}

impl std::error::Error for ReplayError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl ReplayError {
    /// Wraps an I/O error with what was being done.
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }
}
