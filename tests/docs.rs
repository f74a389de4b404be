//! The documentation against the code: every `radixd` command line in
//! README.md and docs/*.md parses with the current command line, and every
//! relative link there leads somewhere.
//!
//! **Commands.** A command line is a line of a fenced code block that,
//! after an optional `$ ` prompt, starts with `radixd` (or `cargo run
//! --release --`, `target/release/radixd`, `target/debug/radixd`). A line
//! ending in `\` goes on on the next one. The command stops at a shell
//! operator (`|`, `&&`, `;`, `&`, a redirection) or a `#` comment. Each is
//! run as the built binary with its arguments and a trailing `--help`:
//! clap rejects an unknown subcommand, an unknown flag or a bad value met
//! before `--help` (exit status 2), and otherwise prints the help and exits
//! 0 without running anything. No daemon is needed.
//!
//! Synopsis notation is understood, so a synopsis is checked too:
//! - `[...]` marks something optional: the brackets are dropped and what
//!   they hold is checked;
//! - `a|b` inside one word lists alternatives: the line is checked once
//!   with each (all such words take their first, then their second, ...);
//! - `...` and `…` are dropped, with the flag just before them
//!   (`[--subscribe ...]`: the flag again);
//! - a word with quotes in it (`--tokens '[1,2,3]'`) is taken as it is;
//! - a placeholder is a word (or the value after `--flag=`) with capitals
//!   and no lower-case letter (`NAME`, `SECS`, `WORKER=ENDPOINT`), or
//!   anything in angle brackets (`<KV pool size in pages>`). The ones in
//!   [`PLACEHOLDERS`] get their sample value; any other is tried with each
//!   of [`CANDIDATES`] (all of a line's unknown placeholders at once), and
//!   the line passes if one of them parses.
//!
//! **Links.** Every `[text](target)` and `![alt](target)` outside code
//! whose target has no scheme (`https:` and the like are not checked) must
//! name an existing file or directory, relative to the page; a `#anchor`
//! into a Markdown page must name one of its headings (GitHub's slugs).
//!
//! **Skipping.** A command line containing `docs-check: skip` (as a
//! trailing `# docs-check: skip` comment) is not run; a Markdown line
//! containing `<!-- docs-check: skip -->` has its links left unchecked.
//! Use them only for what cannot be checked here (a command of a branch
//! not merged yet), and say why next to the marker.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// The marker that exempts one command line or one Markdown line.
const SKIP: &str = "docs-check: skip";

/// Sample values of the placeholders the docs use.
const PLACEHOLDERS: &[(&str, &str)] = &[
    ("NAME", "radixd"),
    ("N", "1"),
    ("SECS", "1"),
    ("MS", "1"),
    ("SEQ", "0"),
    ("SEED", "0"),
    ("FILE", "trace.jsonl"),
    ("TRACE", "trace.jsonl"),
    ("ENDPOINT", "tcp://127.0.0.1:5557"),
    ("T", "topic"),
    ("M", "GPU"),
    ("MODE", "0600"),
];

/// Values tried, in turn, for a placeholder not in [`PLACEHOLDERS`].
const CANDIDATES: &[&str] = &[
    "1",
    "radixd",
    "tcp://127.0.0.1:5557",
    "w=tcp://127.0.0.1:5557",
];

/// How a command line may start, and what stands for `radixd` in it.
const PREFIXES: &[&str] = &[
    "radixd",
    "cargo run --release --",
    "cargo run --",
    "target/release/radixd",
    "target/debug/radixd",
    "./target/release/radixd",
    "./target/debug/radixd",
];

/// A piece of documentation: where it is and the line it starts on.
#[derive(Debug, Clone)]
struct Found {
    file: PathBuf,
    line: usize,
    text: String,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every docs/*.md, in a stable order.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = fs::read_dir(root().join("docs"))
        .expect("docs/ exists")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Is `line` a code fence (```` ``` ```` or `~~~`, indented or not)?
fn is_fence(line: &str) -> bool {
    let t = line.trim_start();
    t.starts_with("```") || t.starts_with("~~~")
}

/// The command lines of one page's code blocks, continuations joined.
fn command_lines(file: &Path, text: &str) -> Vec<Found> {
    let mut found = Vec::new();
    let mut in_code = false;
    let mut pending: Option<Found> = None;
    for (i, line) in text.lines().enumerate() {
        if is_fence(line) {
            in_code = !in_code;
            pending = None;
            continue;
        }
        if !in_code {
            continue;
        }
        let line = line.trim();
        let (joined, start) = match pending.take() {
            Some(mut p) => {
                p.text.push(' ');
                p.text.push_str(line);
                (p.text, p.line)
            }
            None => (line.to_owned(), i + 1),
        };
        if let Some(rest) = joined.strip_suffix('\\') {
            pending = Some(Found {
                file: file.to_owned(),
                line: start,
                text: rest.trim_end().to_owned(),
            });
            continue;
        }
        let cmd = joined.strip_prefix("$ ").unwrap_or(&joined).trim();
        if PREFIXES.iter().any(|p| starts_command(cmd, p)) {
            found.push(Found {
                file: file.to_owned(),
                line: start,
                text: cmd.to_owned(),
            });
        }
    }
    found
}

/// Does `cmd` start with the word(s) `prefix`, followed by nothing or a
/// space?
fn starts_command(cmd: &str, prefix: &str) -> bool {
    cmd.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(' '))
}

/// One argument as a shell splits it; a word with quotes in it is taken
/// as it is, never as synopsis notation.
struct Word {
    text: String,
    quoted: bool,
}

/// The arguments after the program, as a shell splits them (quotes
/// honoured, no expansion), up to the first operator or comment.
fn shell_words(cmd: &str) -> Vec<Word> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quoted = false;
    let mut chars = cmd.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' => {
                in_word = true;
                quoted = true;
                for q in chars.by_ref() {
                    if q == c {
                        break;
                    }
                    word.push(q);
                }
            }
            '\\' => {
                in_word = true;
                quoted = true;
                if let Some(n) = chars.next() {
                    word.push(n);
                }
            }
            ' ' | '\t' => {
                if in_word {
                    words.push(Word {
                        text: std::mem::take(&mut word),
                        quoted,
                    });
                    in_word = false;
                    quoted = false;
                }
            }
            '#' if !in_word => break,
            _ => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(Word { text: word, quoted });
    }
    let end = words
        .iter()
        .position(|w| !w.quoted && is_operator(&w.text))
        .unwrap_or(words.len());
    words.truncate(end);
    words
}

/// A shell operator or redirection that ends the command.
fn is_operator(w: &str) -> bool {
    matches!(w, "|" | "||" | "&&" | ";" | "&")
        || w.starts_with('>')
        || w.starts_with('<')
        || w.starts_with("2>")
        || w.starts_with("1>")
}

/// Does `w` stand for a value rather than spell one?
fn is_placeholder(w: &str) -> bool {
    w.chars().any(|c| c.is_ascii_uppercase()) && !w.chars().any(|c| c.is_ascii_lowercase())
}

/// The argument lists that check one command line: one per alternative of
/// its `a|b` words, each with every placeholder filled in with `unknown`
/// where [`PLACEHOLDERS`] has no sample for it.
fn argument_lists(cmd: &str, unknown: &str) -> Vec<Vec<String>> {
    let prefix = PREFIXES
        .iter()
        .filter(|p| starts_command(cmd, p))
        .max_by_key(|p| p.len())
        .expect("a command line");
    // `<a phrase>` is one placeholder, spaces and all; a `<` followed by
    // a space, or never closed, is a redirection.
    let mut rest = String::new();
    let mut tail = &cmd[prefix.len()..];
    while let Some(at) = tail.find('<') {
        rest.push_str(&tail[..at]);
        let after = &tail[at + 1..];
        match after.find('>') {
            Some(end) if !after.starts_with(char::is_whitespace) => {
                rest.push_str("PLACEHOLDER");
                tail = &after[end + 1..];
            }
            _ => {
                rest.push('<');
                tail = after;
            }
        }
    }
    rest.push_str(tail);
    // Synopsis notation, in unquoted words only: brackets go, `...` (and
    // the flag it repeats) goes.
    let mut words: Vec<Word> = Vec::new();
    for w in shell_words(&rest) {
        if w.quoted {
            words.push(w);
            continue;
        }
        let text: String = w.text.chars().filter(|c| !matches!(c, '[' | ']')).collect();
        if text == "..." || text == "…" {
            if words
                .last()
                .is_some_and(|p| !p.quoted && p.text.starts_with('-'))
            {
                words.pop();
            }
        } else if !text.is_empty() {
            words.push(Word {
                text,
                quoted: false,
            });
        }
    }
    let alts = |w: &Word| {
        if w.quoted {
            vec![w.text.clone()]
        } else {
            alternatives(&w.text)
                .into_iter()
                .map(|a| fill(a, unknown))
                .collect()
        }
    };
    let variants = words.iter().map(|w| alts(w).len()).max().unwrap_or(1);
    (0..variants)
        .map(|v| {
            words
                .iter()
                .map(|w| {
                    let a = alts(w);
                    a[v.min(a.len() - 1)].clone()
                })
                .collect()
        })
        .collect()
}

/// `a|b|c` as its alternatives (a flag's `--x|--y` too); any other word as
/// itself.
fn alternatives(w: &str) -> Vec<&str> {
    if w.len() > 1 && w.contains('|') {
        w.split('|').filter(|a| !a.is_empty()).collect()
    } else {
        vec![w]
    }
}

/// One word with its placeholder (the whole word, or a flag's `=VALUE`)
/// replaced by a sample value.
fn fill(w: &str, unknown: &str) -> String {
    let sample = |p: &str| {
        PLACEHOLDERS
            .iter()
            .find(|(name, _)| *name == p)
            .map_or(unknown, |(_, v)| v)
            .to_owned()
    };
    if let Some((flag, value)) = w.split_once('=').filter(|(f, _)| f.starts_with("--")) {
        if is_placeholder(value) {
            return format!("{flag}={}", sample(value));
        }
        return w.to_owned();
    }
    if !w.starts_with('-') && is_placeholder(w) {
        return sample(w);
    }
    w.to_owned()
}

/// Runs the binary with `args` and `--help`; `Err` says why it failed.
fn parses(args: &[String]) -> Result<(), String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_radixd"))
        .args(args)
        .arg("--help")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run radixd: {e}"))?;
    // `--help` stops the binary at once; anything else means it started
    // to run for real, which must not happen here.
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().map_err(|e| e.to_string())?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err("did not stop at --help within 20 s".into());
        }
        thread::sleep(Duration::from_millis(5));
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if out.status.success() && stdout.contains("Usage:") {
        Ok(())
    } else {
        Err(format!(
            "exit {:?}: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Checks one command line; `Err` has every failure, one a line.
fn check_command(cmd: &str) -> Result<(), String> {
    let has_unknown = argument_lists(cmd, "\u{0}")
        .iter()
        .flatten()
        .any(|w| w.contains('\u{0}'));
    let tries: &[&str] = if has_unknown { CANDIDATES } else { &[""] };
    let mut errors = Vec::new();
    for unknown in tries {
        let mut failed = None;
        for args in argument_lists(cmd, unknown) {
            if let Err(e) = parses(&args) {
                failed = Some(format!("radixd {}: {e}", args.join(" ")));
                break;
            }
        }
        match failed {
            None => return Ok(()),
            Some(e) => errors.push(e),
        }
    }
    Err(errors.join("\n    "))
}

/// GitHub's anchor for a heading: lower case, punctuation other than `-`
/// and `_` dropped, spaces as `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown page's headings (repeated ones numbered as
/// GitHub numbers them).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut set = BTreeSet::new();
    let mut in_code = false;
    for line in text.lines() {
        if is_fence(line) {
            in_code = !in_code;
            continue;
        }
        let t = line.trim_start();
        if in_code || !t.starts_with('#') {
            continue;
        }
        let heading = t.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let base = slug(heading);
        let mut anchor = base.clone();
        let mut n = 0;
        while set.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        set.insert(anchor);
    }
    set
}

/// The link targets of a page, outside code blocks and inline code.
fn links(file: &Path, text: &str) -> Vec<Found> {
    let mut found = Vec::new();
    let mut in_code = false;
    for (i, line) in text.lines().enumerate() {
        if is_fence(line) {
            in_code = !in_code;
            continue;
        }
        if in_code || line.contains(SKIP) {
            continue;
        }
        // Inline code may hold `](` that is no link.
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].split_whitespace().next().unwrap_or("");
            found.push(Found {
                file: file.to_owned(),
                line: i + 1,
                text: target.to_owned(),
            });
            rest = &after[end..];
        }
    }
    found
}

/// Checks one link target of the page `from`.
fn check_link(from: &Path, target: &str) -> Result<(), String> {
    if target.is_empty() {
        return Err("empty link".into());
    }
    if target.contains("://") || target.starts_with("mailto:") {
        return Ok(());
    }
    let (path, anchor) = match target.split_once('#') {
        Some((p, a)) => (p, Some(a)),
        None => (target, None),
    };
    let dest = if path.is_empty() {
        from.to_owned()
    } else {
        from.parent().expect("a page's folder").join(path)
    };
    if !dest.exists() {
        return Err(format!("{} does not exist", dest.display()));
    }
    match anchor {
        Some(a) if dest.extension().is_some_and(|e| e == "md") => {
            if anchors(&read(&dest)).contains(a) {
                Ok(())
            } else {
                Err(format!("{} has no heading #{a}", dest.display()))
            }
        }
        _ => Ok(()),
    }
}

fn report(failures: &[String], what: &str) {
    assert!(
        failures.is_empty(),
        "{} {what}:\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
}

fn at(f: &Found) -> String {
    let rel = f.file.strip_prefix(root()).unwrap_or(&f.file);
    format!("{}:{}", rel.display(), f.line)
}

#[test]
fn command_lines_parse() {
    let mut checked = 0;
    let mut failures = Vec::new();
    for page in pages() {
        for cmd in command_lines(&page, &read(&page)) {
            if cmd.text.contains(SKIP) {
                continue;
            }
            checked += 1;
            if let Err(e) = check_command(&cmd.text) {
                failures.push(format!("{}: {}\n    {e}", at(&cmd), cmd.text));
            }
        }
    }
    eprintln!("{checked} command lines checked");
    // The README alone has more than this: a parser that finds nothing
    // must not pass.
    assert!(checked >= 10, "only {checked} command lines found");
    report(&failures, "command lines do not parse");
}

#[test]
fn relative_links_resolve() {
    let mut checked = 0;
    let mut failures = Vec::new();
    for page in pages() {
        for link in links(&page, &read(&page)) {
            checked += 1;
            if let Err(e) = check_link(&page, &link.text) {
                failures.push(format!("{}: ({}) {e}", at(&link), link.text));
            }
        }
    }
    eprintln!("{checked} links checked");
    assert!(checked >= 10, "only {checked} links found");
    report(&failures, "links do not resolve");
}

/// The check itself catches what it is for: a renamed flag or subcommand,
/// a bad value, a missing file or heading.
#[test]
fn the_check_catches_renamed_flags_and_dead_links() {
    assert!(check_command("radixd serve --page-size 16").is_ok());
    assert!(check_command("radixd serve --page-sise 16").is_err());
    assert!(check_command("radixd serve --page-size sixteen").is_err());
    assert!(check_command("radixd srve").is_err());
    // A synopsis: optional parts, alternatives, placeholders.
    assert!(check_command("radixd bench [--transport shm|uds] [--connect NAME]").is_ok());
    assert!(check_command("radixd bench [--transport shm|udp]").is_err());
    assert!(check_command("radixd stat <a daemon's name> --interval SECS").is_ok());
    assert!(check_command("radixd serve --nme WHATEVER").is_err());
    assert!(check_command("radixd exec --connect demo < requests.jsonl").is_ok());
    assert!(check_command("radixd events ENDPOINT [--topic T ...] [--idle-exit SECS]").is_ok());
    assert!(check_command("radixd exec --page-size '[2]'").is_err());
    // Continuations and operators.
    let page = "```sh\nradixd serve \\\n    --pge-size 2 | cat\n```\n";
    let cmds = command_lines(Path::new("x.md"), page);
    assert_eq!(cmds.len(), 1);
    assert_eq!(cmds[0].text, "radixd serve --pge-size 2 | cat");
    assert!(check_command(&cmds[0].text).is_err());

    let readme = root().join("README.md");
    assert!(check_link(&readme, "ARCHITECTURE.md").is_ok());
    assert!(check_link(&readme, "docs/no-such-page.md").is_err());
    assert!(check_link(&readme, "ARCHITECTURE.md#crates").is_ok());
    assert!(check_link(&readme, "ARCHITECTURE.md#no-such-heading").is_err());
    assert_eq!(slug(" `radixd exec`: JSON lines"), "radixd-exec-json-lines");
    let found = links(Path::new("x.md"), "see [a](b.md) and `[c](d.md)`\n");
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].text, "b.md");
}

// ---- Figures a deterministic command prints ----

/// The Mooncake traces: `../shared/traces` beside the repository (as the
/// docs say), else where this machine keeps them, or `RADIXD_TRACES`.
fn traces() -> PathBuf {
    let candidates = [
        std::env::var_os("RADIXD_TRACES").map(PathBuf::from),
        Some(root().join("../shared/traces")),
        Some(PathBuf::from("/work/shared/traces")),
    ];
    candidates
        .into_iter()
        .flatten()
        .find(|d| d.join("conversation_trace.jsonl").is_file())
        .expect("the Mooncake traces (set RADIXD_TRACES)")
}

/// `radixd replay TRACE ARGS...`: each summary line's overall hit rate as
/// the docs print it (`21.57%`), by (policy, capacity).
fn replay_rates(trace: &str, args: &[&str]) -> Vec<(String, u64, String)> {
    let path = traces().join(format!("{trace}_trace.jsonl"));
    let out = Command::new(env!("CARGO_BIN_EXE_radixd"))
        .arg("replay")
        .arg(&path)
        .args(args)
        .output()
        .expect("radixd replay runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("a summary line");
            let rate = v["overall_hit_rate"].as_f64().expect("rate") * 100.0;
            (
                v["policy"].as_str().expect("policy").to_owned(),
                v["capacity_blocks"].as_u64().expect("capacity"),
                format!("{rate:.2}%"),
            )
        })
        .collect()
}

/// The cells of the Markdown table rows of `text` after the line `after`
/// up to the first line that is not a row (header and rule skipped).
fn table_after(text: &str, after: &str) -> Vec<Vec<String>> {
    let start = text
        .lines()
        .position(|l| l.contains(after))
        .unwrap_or_else(|| panic!("no line {after:?}"));
    text.lines()
        .skip(start + 1)
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_owned())
                .collect()
        })
        .collect()
}

/// A capacity column header (`10,000 blocks`) as a number.
fn capacity_of(header: &str) -> u64 {
    header
        .trim_end_matches(" blocks")
        .replace(',', "")
        .parse()
        .unwrap_or_else(|_| panic!("capacity header {header:?}"))
}

/// Issue 29: the hit rates README.md, docs/replay.md and docs/benchmarks.md
/// quote are what `radixd replay` prints now, so a change of policy that moves one fails
/// here until the docs say so.
#[test]
fn replay_figures_are_what_replay_prints() {
    let page = read(&root().join("docs/replay.md"));
    let caps = ["1000", "10000", "50000"];
    let mut printed = Vec::new();
    for trace in ["conversation", "synthetic"] {
        for (recency, policies) in [("exact", "lru,lfu,s3fifo,radix"), ("sglang", "radix")] {
            let args = [
                "--policy",
                policies,
                "--capacity",
                &caps.join(","),
                "--recency",
                recency,
            ];
            for (policy, cap, rate) in replay_rates(trace, &args) {
                printed.push((trace, recency, policy, cap, rate));
            }
        }
    }
    let lookup = |trace: &str, recency: &str, policy: &str, cap: u64| {
        printed
            .iter()
            .find(|p| (p.0, p.1, p.2.as_str(), p.3) == (trace, recency, policy, cap))
            .map(|p| p.4.clone())
            .unwrap_or_else(|| panic!("nothing printed for {trace} {recency} {policy} {cap}"))
    };
    // The main table: trace, policy, one column per capacity.
    let main = table_after(&page, "## Hit rates");
    assert_eq!(main.len(), 8, "{main:?}");
    for row in &main {
        for (cell, cap) in row[2..].iter().zip(caps) {
            let want = lookup(&row[0], "exact", &row[1], cap.parse().unwrap());
            assert_eq!(
                cell, &want,
                "docs/replay.md: {} {} at {cap}",
                row[0], row[1]
            );
        }
    }
    // The --recency sglang table: trace, one column per capacity.
    let sglang = table_after(&page, "With `--recency sglang`");
    assert_eq!(sglang.len(), 2, "{sglang:?}");
    for row in &sglang {
        for (cell, cap) in row[1..].iter().zip(caps) {
            let want = lookup(&row[0], "sglang", "radix", cap.parse().unwrap());
            assert_eq!(cell, &want, "docs/replay.md, sglang: {} at {cap}", row[0]);
        }
    }
    // The capacity headers are the capacities run.
    let header = page
        .lines()
        .find(|l| l.starts_with("| trace | policy |"))
        .expect("the main table's header");
    let heads: Vec<u64> = header
        .trim_matches('|')
        .split('|')
        .skip(2)
        .map(|h| capacity_of(h.trim()))
        .collect();
    assert_eq!(heads, [1000, 10_000, 50_000]);
    // README: "21.57% (`radix`) vs 21.53% (`lru`)" at 10,000 blocks.
    let readme = read(&root().join("README.md"));
    let line = readme
        .lines()
        .find(|l| l.contains("hit rate, Mooncake conversation trace, 10,000 blocks"))
        .expect("the README's hit-rate line");
    let cell = line.split('|').nth(2).expect("the figures cell");
    let mut quoted = 0;
    for part in cell.split(" vs ") {
        let (rate, policy) = part.trim().split_once(' ').expect("RATE (`policy`)");
        let policy = policy.trim_matches(|c| "()`".contains(c));
        assert_eq!(
            rate,
            lookup("conversation", "exact", policy, 10_000),
            "README: {policy}"
        );
        quoted += 1;
    }
    assert_eq!(quoted, 2, "{line}");
    // docs/benchmarks.md: "`radix` against `lru` | 21.57% against 21.53%".
    let bench = read(&root().join("docs/benchmarks.md"));
    let line = bench
        .lines()
        .find(|l| l.contains("hit rate, Mooncake conversation trace, 10,000 blocks"))
        .expect("the benchmarks' hit-rate line");
    let cells: Vec<&str> = line.split('|').map(str::trim).collect();
    let policies: Vec<&str> = cells[1].split('`').skip(1).step_by(2).collect();
    let rates: Vec<&str> = cells[2].split(" against ").collect();
    assert_eq!(policies, ["radix", "lru"], "{line}");
    for (policy, rate) in policies.iter().zip(&rates) {
        assert_eq!(
            *rate,
            lookup("conversation", "exact", policy, 10_000),
            "docs/benchmarks.md: {policy}"
        );
    }
    // The hybrid table: the components' flags in the first cell, at 8,000
    // blocks on the conversation trace.
    let hybrid = table_after(&page, "On the conversation trace at 8,000 blocks");
    assert_eq!(hybrid.len(), 4, "{hybrid:?}");
    for row in &hybrid {
        let flags = row[0].split('`').nth(1).expect("`flags`");
        let mut args = vec!["--policy", "radix", "--capacity", "8000", "--components"];
        args.extend(flags.split_whitespace());
        let printed = replay_rates("conversation", &args);
        assert_eq!(printed.len(), 1);
        assert_eq!(row[1], printed[0].2, "docs/replay.md, hybrid: {flags}");
    }
}

/// Issue 37: docs/hybrid.md's table of hit rates under both recency rules
/// (which one answers as SGLang is the point of that section) is what
/// `radixd replay` prints, row by row.
#[test]
fn hybrid_recency_figures_are_what_replay_prints() {
    let page = read(&root().join("docs/hybrid.md"));
    let rows = table_after(&page, "Hit rates under both rules");
    assert_eq!(rows.len(), 8, "{rows:?}");
    for row in &rows {
        let [trace, components, capacity, exact, sglang] = &row[..] else {
            panic!("docs/hybrid.md, recency: a row of five cells: {row:?}");
        };
        let flags = components.split('`').nth(1).expect("`flags`");
        let capacity = capacity_of(capacity).to_string();
        for (rule, cell) in [("exact", exact), ("sglang", sglang)] {
            let mut args = vec!["--policy", "radix", "--capacity", &capacity];
            args.extend(["--recency", rule, "--components"]);
            args.extend(flags.split_whitespace());
            let printed = replay_rates(trace, &args);
            assert_eq!(printed.len(), 1);
            assert_eq!(
                cell, &printed[0].2,
                "docs/hybrid.md, recency {rule}: {trace} {flags} at {capacity}"
            );
        }
    }
}
