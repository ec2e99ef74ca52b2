//! Stop strings, matched on the generated text as it streams.
//!
//! Invariants: text is released only once it cannot be the start of a stop string, so a
//! client never sees any part of a stop string; the output ends right before the earliest
//! match; released pieces always split on `char` boundaries.

#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
}

/// What pushing a token's text yields.
#[derive(Debug, PartialEq, Eq)]
pub struct Released {
    /// Text safe to send now.
    pub text: String,
    /// A stop string matched: the request is finished.
    pub stopped: bool,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        StopMatcher {
            stops,
            pending: String::new(),
        }
    }

    pub fn push(&mut self, text: &str) -> Released {
        if self.stops.is_empty() {
            return Released {
                text: text.to_string(),
                stopped: false,
            };
        }
        self.pending.push_str(text);
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min()
        {
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return Released {
                text: out,
                stopped: true,
            };
        }
        let hold = self
            .stops
            .iter()
            .map(|s| longest_suffix_prefix(&self.pending, s))
            .max()
            .unwrap_or(0);
        let cut = self.pending.len() - hold;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        Released {
            text: out,
            stopped: false,
        }
    }

    /// Whatever is held back, at the end of generation.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

/// Length of the longest proper prefix of `stop` that `text` ends with.
fn longest_suffix_prefix(text: &str, stop: &str) -> usize {
    let max = stop.len().saturating_sub(1).min(text.len());
    (1..=max)
        .rev()
        .find(|&k| {
            stop.is_char_boundary(k)
                && text.is_char_boundary(text.len() - k)
                && text.ends_with(&stop[..k])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let r = m.push(p);
            out.push_str(&r.text);
            if r.stopped {
                return (out, true);
            }
        }
        out.push_str(&m.flush());
        (out, false)
    }

    #[test]
    fn stops_across_pieces() {
        assert_eq!(
            run(&["END"], &["ab", "cE", "N", "Dxx"]),
            ("abc".into(), true)
        );
        assert_eq!(run(&["END"], &["ab", "cE", "N"]), ("abcEN".into(), false));
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
        assert_eq!(run(&["é!", "zz"], &["aé", "!b"]), ("a".into(), true));
        assert_eq!(run(&["xy", "b"], &["aab"]), ("aa".into(), true));
    }

    #[test]
    fn holds_back_only_possible_prefixes() {
        let mut m = StopMatcher::new(vec!["\n\n".into()]);
        assert_eq!(m.push("hi\n").text, "hi");
        assert_eq!(m.push("there").text, "\nthere");
    }
}
