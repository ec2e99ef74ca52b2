//! Reading what an answer really cost from the engine's `usage` as it streams past.
//!
//! The fair queue charges a tenant the router's estimate when its request is placed; the
//! engine's `usage` (in every non-streamed answer, and in the last event of a stream whose
//! client asked for it with `stream_options.include_usage`) replaces the estimate when the
//! answer ends. The router does not parse the body (it passes it through as it comes): it
//! looks for the two counts in the bytes, carrying a few bytes over from one chunk to the
//! next so a count split across chunks is still read.
//!
//! Invariants: reads only; keeps at most [`CARRY`] bytes between chunks; the last count
//! seen wins (usage comes last in an answer).

/// Bytes kept from the end of one chunk for the next (longer than a key and its number).
const CARRY: usize = 48;
const PROMPT: &[u8] = b"\"prompt_tokens\":";
const COMPLETION: &[u8] = b"\"completion_tokens\":";

/// Scans an answer's chunks for its `usage`.
#[derive(Debug, Default)]
pub struct UsageScan {
    carry: Vec<u8>,
    prompt: Option<u64>,
    completion: Option<u64>,
}

impl UsageScan {
    /// Looks at the next chunk of the answer.
    pub fn feed(&mut self, chunk: &[u8]) {
        let mut window = std::mem::take(&mut self.carry);
        window.extend_from_slice(chunk);
        if let Some(n) = last_count(&window, PROMPT) {
            self.prompt = Some(n);
        }
        if let Some(n) = last_count(&window, COMPLETION) {
            self.completion = Some(n);
        }
        let keep = window.len().min(CARRY);
        self.carry = window[window.len() - keep..].to_vec();
    }

    /// Prompt plus completion tokens, once both were seen.
    pub fn total(&self) -> Option<u64> {
        Some(self.prompt?.saturating_add(self.completion?))
    }
}

/// The number after the last complete `key` in `buf` (one whose digits end before the
/// buffer does).
fn last_count(buf: &[u8], key: &[u8]) -> Option<u64> {
    let mut found = None;
    let mut from = 0;
    while let Some(at) = find(&buf[from..], key) {
        let start = from + at + key.len();
        let rest = &buf[start..];
        let skip = rest.iter().take_while(|b| **b == b' ').count();
        let digits = rest[skip..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        let ended = start + skip + digits < buf.len();
        if digits > 0 && ended {
            let text = std::str::from_utf8(&rest[skip..skip + digits]).ok()?;
            found = text.parse().ok().or(found);
        }
        from = start;
    }
    found
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_usage_whole_or_split_across_chunks() {
        let body =
            br#"{"id":"x","usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}}"#;
        let mut whole = UsageScan::default();
        whole.feed(body);
        assert_eq!(whole.total(), Some(46));
        for cut in 1..body.len() {
            let mut s = UsageScan::default();
            s.feed(&body[..cut]);
            s.feed(&body[cut..]);
            assert_eq!(s.total(), Some(46), "cut at {cut}");
        }
    }

    #[test]
    fn no_usage_no_total_and_the_last_one_wins() {
        let mut s = UsageScan::default();
        s.feed(b"data: {\"choices\":[{\"text\":\"hi\"}]}\n\n");
        assert_eq!(s.total(), None);
        s.feed(b"data: {\"usage\":{\"prompt_tokens\": 5,\"completion_tokens\":1}}\n\n");
        s.feed(b"data: {\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":9}}\n\ndata: [DONE]");
        assert_eq!(s.total(), Some(14));
    }
}
