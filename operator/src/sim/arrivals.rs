//! Where a run's arrivals come from: an analytic trace (session starts drawn each second
//! from a tenant population, with follow-up turns) or a trace file (every request given,
//! nothing else), and what the oracles may know of it ahead of time.
//!
//! Invariants: the analytic source is exactly the built-in `Trace` (runs on it are unchanged);
//! a file's expected rate is its own arrivals per minute, smoothed over the minute before and
//! after, so the oracles know the file (that is their definition: foresight of the traffic).
//! A file source has no warm-up and no step; it lasts until its last arrival.

use super::trace::Trace;
use super::trace_file::FileTrace;

/// What the oracles may read: requests (or session starts) per second expected at time t
/// (seconds from the trace's start).
pub trait Foresight: Sync {
    fn expected_base_rate(&self, t: f64) -> f64;
}

impl Foresight for Trace {
    fn expected_base_rate(&self, t: f64) -> f64 {
        Trace::expected_base_rate(self, t)
    }
}

/// A trace file and its expected rate.
#[derive(Debug)]
pub struct FileSource {
    pub trace: FileTrace,
    /// Expected arrivals per second, per minute of the file.
    per_minute: Vec<f64>,
}

impl FileSource {
    pub fn new(trace: FileTrace) -> Self {
        let minutes = (trace.arrivals.last().map_or(0, |a| a.t_us) / 60_000_000) as usize + 1;
        let mut counts = vec![0.0f64; minutes];
        for a in &trace.arrivals {
            counts[(a.t_us / 60_000_000) as usize] += 1.0;
        }
        let per_minute = (0..minutes)
            .map(|m| {
                let lo = m.saturating_sub(1);
                let hi = (m + 1).min(minutes - 1);
                counts[lo..=hi].iter().sum::<f64>() / ((hi - lo + 1) as f64 * 60.0)
            })
            .collect();
        FileSource { trace, per_minute }
    }

    /// Whole seconds from the start past the last arrival (so the last one is replayed).
    pub fn duration_s(&self) -> u64 {
        self.trace.arrivals.last().map_or(0, |a| a.t_us) / 1_000_000 + 1
    }
}

impl Foresight for FileSource {
    fn expected_base_rate(&self, t: f64) -> f64 {
        let m = ((t.max(0.0) / 60.0) as usize).min(self.per_minute.len() - 1);
        self.per_minute[m]
    }
}

/// The arrivals of one run.
#[derive(Clone, Copy, Debug)]
pub enum Source<'a> {
    Analytic(&'a Trace),
    File(&'a FileSource),
}

impl<'a> Source<'a> {
    pub fn name(&self) -> &'static str {
        match self {
            Source::Analytic(t) => t.kind.name(),
            Source::File(_) => "file",
        }
    }

    pub fn duration_s(&self) -> u64 {
        match self {
            Source::Analytic(t) => t.duration_s,
            Source::File(f) => f.duration_s(),
        }
    }

    /// When a step starts (for time-to-react), seconds.
    pub fn step_at(&self) -> Option<u64> {
        match self {
            Source::Analytic(t) => t.step_at,
            Source::File(_) => None,
        }
    }

    /// Which random stream the run draws from.
    pub fn stream(&self) -> u64 {
        match self {
            Source::Analytic(t) => t.kind as u64 + 1,
            Source::File(_) => 0xf11e,
        }
    }

    pub fn foresight(&self) -> &'a dyn Foresight {
        match *self {
            Source::Analytic(t) => t,
            Source::File(f) => f,
        }
    }
}
