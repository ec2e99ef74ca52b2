//! Trace files: one arrival per line, as JSON Lines or CSV.
//!
//! JSON Lines: `{"t": 12.5, "tenant": "acme", "tier": "standard", "prompt_tokens": 800,
//! "output_tokens": 200, "session": "s-17"}` (`session` optional; other keys ignored). CSV: a
//! header naming the same columns in any order, then one row per arrival (no quoting: values
//! hold no commas; an empty `session` cell is none). The format is CSV for a `.csv` file,
//! JSON Lines for `.jsonl`/`.ndjson`/`.json`, otherwise JSON Lines if the first line that is
//! not blank or a comment starts with `{`. Blank lines and lines starting with `#` are
//! skipped in both.
//!
//! Invariants: `t` (seconds from the start) is finite, non-negative and non-decreasing down
//! the file; token counts are integers (`output_tokens` ≥ 1); every tier names one of the
//! run's tiers; a tenant keeps one tier. Any violation is an error `FILE:LINE: what`, with
//! the file's 1-based line number. Tenants and sessions are numbered in order of first
//! appearance; a session id is global to the file.

use std::collections::HashMap;
use std::path::Path;

use anyhow::Context;
use serde_json::Value;

use super::tiers::TierTable;

/// No session id on the line: a session of its own.
pub const NO_SESSION: u32 = u32::MAX;

/// One line of a trace file.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Arrival {
    /// Microseconds from the start.
    pub t_us: u64,
    pub tenant: u32,
    /// Tier slot (see `TierTable`).
    pub tier: u8,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    /// Session number, or `NO_SESSION`.
    pub session: u32,
}

/// A parsed trace file.
#[derive(Clone, Debug)]
pub struct FileTrace {
    /// The file, as given (for messages and the report).
    pub name: String,
    pub arrivals: Vec<Arrival>,
    /// Tier slot of each tenant, by tenant number.
    pub tenant_tiers: Vec<u8>,
    pub sessions: u32,
}

/// One line's fields, before numbering.
struct Fields<'a> {
    t: f64,
    tenant: &'a str,
    tier: &'a str,
    prompt_tokens: u32,
    output_tokens: u32,
    session: Option<&'a str>,
}

const COLUMNS: [&str; 6] = [
    "t",
    "tenant",
    "tier",
    "prompt_tokens",
    "output_tokens",
    "session",
];

/// Reads and parses a trace file.
pub fn load(path: &Path, tiers: &TierTable) -> anyhow::Result<FileTrace> {
    let name = path.display().to_string();
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading trace file {name}"))?;
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let csv = match ext.as_deref() {
        Some("csv") => true,
        Some("jsonl" | "ndjson" | "json") => false,
        _ => content_lines(&text)
            .next()
            .is_some_and(|(_, l)| !l.starts_with('{')),
    };
    parse(&name, &text, csv, tiers)
}

/// Lines that are neither blank nor comments, with their 1-based numbers, trimmed.
fn content_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'))
}

/// Parses a trace's text (`name` is only for messages).
pub fn parse(name: &str, text: &str, csv: bool, tiers: &TierTable) -> anyhow::Result<FileTrace> {
    let mut b = Builder::new(name, tiers);
    let mut lines = content_lines(text);
    if csv {
        let Some((n, header)) = lines.next() else {
            anyhow::bail!("{name}: no header line and no arrivals");
        };
        let cols = csv_header(header).map_err(|e| anyhow::anyhow!("{name}:{n}: {e}"))?;
        for (n, line) in lines {
            let f = csv_fields(&cols, line).map_err(|e| anyhow::anyhow!("{name}:{n}: {e}"))?;
            b.push(n, &f)?;
        }
    } else {
        for (n, line) in lines {
            let v: Value = serde_json::from_str(line)
                .map_err(|e| anyhow::anyhow!("{name}:{n}: not a JSON object: {e}"))?;
            let f = json_fields(&v).map_err(|e| anyhow::anyhow!("{name}:{n}: {e}"))?;
            b.push(n, &f)?;
        }
    }
    b.finish()
}

/// Numbers tenants and sessions, checks order and tiers.
struct Builder<'a> {
    name: &'a str,
    tiers: &'a TierTable,
    tenants: HashMap<String, (u32, u8, usize)>,
    sessions: HashMap<String, u32>,
    out: FileTrace,
    last_t: f64,
}

impl<'a> Builder<'a> {
    fn new(name: &'a str, tiers: &'a TierTable) -> Self {
        Builder {
            name,
            tiers,
            tenants: HashMap::new(),
            sessions: HashMap::new(),
            out: FileTrace {
                name: name.to_string(),
                arrivals: Vec::new(),
                tenant_tiers: Vec::new(),
                sessions: 0,
            },
            last_t: 0.0,
        }
    }

    fn push(&mut self, n: usize, f: &Fields<'_>) -> anyhow::Result<()> {
        let name = self.name;
        let err = |what: String| anyhow::anyhow!("{name}:{n}: {what}");
        if f.t < self.last_t {
            return Err(err(format!(
                "t = {} is before the previous line's {} (lines must be in time order)",
                f.t, self.last_t
            )));
        }
        self.last_t = f.t;
        let Some(slot) = self.tiers.slot(f.tier) else {
            return Err(err(format!(
                "unknown tier {:?} (the pool's tiers: {})",
                f.tier,
                self.tiers.names.join(", ")
            )));
        };
        let slot = slot as u8;
        let next = self.tenants.len() as u32;
        let (tenant, tier, first) = *self
            .tenants
            .entry(f.tenant.to_string())
            .or_insert((next, slot, n));
        if tier != slot {
            return Err(err(format!(
                "tenant {:?} is tier {:?} here but {:?} on line {first}",
                f.tenant,
                f.tier,
                self.tiers.names[usize::from(tier)]
            )));
        }
        if tenant == next {
            self.out.tenant_tiers.push(slot);
        }
        let session = match f.session {
            Some(s) => {
                let next = self.sessions.len() as u32;
                *self.sessions.entry(s.to_string()).or_insert(next)
            }
            None => NO_SESSION,
        };
        self.out.arrivals.push(Arrival {
            t_us: (f.t * 1e6).round() as u64,
            tenant,
            tier: slot,
            prompt_tokens: f.prompt_tokens,
            output_tokens: f.output_tokens,
            session,
        });
        Ok(())
    }

    fn finish(mut self) -> anyhow::Result<FileTrace> {
        if self.out.arrivals.is_empty() {
            anyhow::bail!("{}: empty trace (no arrivals)", self.name);
        }
        self.out.sessions = self.sessions.len() as u32;
        Ok(self.out)
    }
}

fn json_fields(v: &Value) -> Result<Fields<'_>, String> {
    let obj = v.as_object().ok_or("not a JSON object")?;
    let get = |k: &str| obj.get(k).ok_or_else(|| format!("missing field {k:?}"));
    let text = |k: &str| -> Result<&str, String> {
        get(k)?
            .as_str()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| format!("field {k:?} must be a non-empty string"))
    };
    let number = |k: &str| -> Result<String, String> {
        let v = get(k)?;
        v.is_number()
            .then(|| v.to_string())
            .ok_or_else(|| format!("field {k:?} must be a number"))
    };
    let session = match obj.get("session") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if !s.is_empty() => Some(s.as_str()),
        Some(_) => return Err("field \"session\" must be a non-empty string".into()),
    };
    Ok(Fields {
        t: seconds(&number("t")?)?,
        tenant: text("tenant")?,
        tier: text("tier")?,
        prompt_tokens: tokens("prompt_tokens", &number("prompt_tokens")?, 0)?,
        output_tokens: tokens("output_tokens", &number("output_tokens")?, 1)?,
        session,
    })
}

/// Column index of each of `COLUMNS` (the session's may be absent).
fn csv_header(line: &str) -> Result<[Option<usize>; 6], String> {
    let names: Vec<&str> = line.split(',').map(str::trim).collect();
    let mut cols = [None; 6];
    for (c, col) in COLUMNS.iter().zip(cols.iter_mut()) {
        *col = names.iter().position(|n| n == c);
        if col.is_none() && *c != "session" {
            return Err(format!(
                "CSV header lacks column {c:?} (expected {})",
                COLUMNS.join(",")
            ));
        }
    }
    Ok(cols)
}

fn csv_fields<'l>(cols: &[Option<usize>; 6], line: &'l str) -> Result<Fields<'l>, String> {
    let cells: Vec<&str> = line.split(',').map(str::trim).collect();
    let want = cols.iter().flatten().max().map_or(0, |m| m + 1);
    if cells.len() < want {
        return Err(format!("{} cells, the header has {want}", cells.len()));
    }
    let cell = |i: usize| -> Result<&'l str, String> {
        let c = cols[i].map_or("", |c| cells[c]);
        if c.is_empty() && i != 5 {
            return Err(format!("missing field {:?}", COLUMNS[i]));
        }
        Ok(c)
    };
    Ok(Fields {
        t: seconds(cell(0)?)?,
        tenant: cell(1)?,
        tier: cell(2)?,
        prompt_tokens: tokens("prompt_tokens", cell(3)?, 0)?,
        output_tokens: tokens("output_tokens", cell(4)?, 1)?,
        session: Some(cell(5)?).filter(|s| !s.is_empty()),
    })
}

fn seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(t) if t.is_finite() && t >= 0.0 => Ok(t),
        _ => Err(format!(
            "field \"t\" must be a non-negative number of seconds, got {s}"
        )),
    }
}

fn tokens(field: &str, s: &str, min: u32) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(n) if n >= min => Ok(n),
        _ => Err(format!(
            "field {field:?} must be an integer ≥ {min}, got {s}"
        )),
    }
}

#[cfg(test)]
#[path = "trace_file_tests.rs"]
mod tests;
