//! Trace format: one JSON request object per line (Mooncake FAST'25 traces).

use std::io::BufRead;

use serde::Deserialize;

use super::ReplayError;

/// One request of a trace line.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct TraceRequest {
    /// Arrival time in milliseconds.
    pub timestamp: u64,
    /// Prompt length in tokens.
    pub input_length: u64,
    /// Generated length in tokens (unused by replay).
    pub output_length: u64,
    /// Block ids of the prompt, in order; equal ids at equal positions mean
    /// equal prefixes.
    pub hash_ids: Vec<u64>,
}

/// Parses a whole trace, streaming it line by line.
///
/// Blank lines are skipped; any other line that is not a request object is
/// an error naming its 1-based line number. `source` names the trace in I/O
/// error messages.
pub fn parse_trace(reader: impl BufRead, source: &str) -> Result<Vec<TraceRequest>, ReplayError> {
    let mut requests = Vec::new();
    let mut reader = reader;
    let mut line = String::new();
    let mut line_no = 0usize;
    loop {
        line.clear();
        let read = reader
            .read_line(&mut line)
            .map_err(|e| ReplayError::io(format!("reading trace {source}"), e))?;
        if read == 0 {
            return Ok(requests);
        }
        line_no += 1;
        if line.trim().is_empty() {
            continue;
        }
        let request =
            serde_json::from_str::<TraceRequest>(&line).map_err(|e| ReplayError::Parse {
                line: line_no,
                message: column_only(&e),
            })?;
        requests.push(request);
    }
}

/// serde_json positions are relative to the single line we handed it, so
/// "at line 1 column 7" would contradict our own line number; keep the column.
fn column_only(err: &serde_json::Error) -> String {
    let text = err.to_string();
    let suffix = format!(" at line {} column {}", err.line(), err.column());
    match text.strip_suffix(&suffix) {
        Some(message) => format!("{message} (column {})", err.column()),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lines_and_skips_blank_ones() {
        let text = "{\"timestamp\": 5, \"input_length\": 700, \"output_length\": 3, \"hash_ids\": [7, 8]}\n\
                    \n\
                    {\"timestamp\": 6, \"input_length\": 1, \"output_length\": 0, \"hash_ids\": [9], \"extra\": 1}\n";
        let requests = parse_trace(text.as_bytes(), "test").unwrap();
        assert_eq!(requests.len(), 2);
        assert_eq!(requests[0].hash_ids, [7, 8]);
        assert_eq!(requests[0].input_length, 700);
        assert_eq!(requests[1].timestamp, 6);
    }

    #[test]
    fn malformed_line_names_its_number() {
        // Line 1 is fine, line 2 is blank, line 3 misses hash_ids.
        let text =
            "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 0, \"hash_ids\": [1]}\n\n\
                    {\"timestamp\": 0, \"input_length\": 1, \"output_length\": 0}\n";
        let err = parse_trace(text.as_bytes(), "test").unwrap_err();
        assert!(matches!(err, ReplayError::Parse { line: 3, .. }), "{err:?}");
        let shown = err.to_string();
        assert!(shown.contains("line 3"), "{shown}");
        assert!(shown.contains("hash_ids"), "{shown}");
        assert!(!shown.contains("line 1 "), "{shown}");
    }
}
