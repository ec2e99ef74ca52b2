//! The in-process client shared by `tidegate-engine bench`'s phases: synthetic prompts, a
//! request builder, and one request driven to its end with every token's arrival time.
//!
//! Invariant: timings start at the request's `arrived` instant (set when it is built, just
//! before submission), so queueing inside the engine counts towards TTFT.

use std::sync::Arc;
use std::time::Instant;

use tidegate_server::backend::{Engine, GenerateRequest, SamplingParams, TokenEvent};

/// Timings of one request.
pub(super) struct Timing {
    /// Arrival to first token, seconds.
    pub ttft: f64,
    /// When each token arrived.
    pub stamps: Vec<Instant>,
}

impl Timing {
    /// Gaps between consecutive tokens, seconds.
    pub fn gaps(&self) -> impl Iterator<Item = f64> + '_ {
        self.stamps
            .windows(2)
            .map(|w| w[1].duration_since(w[0]).as_secs_f64())
    }
}

/// The `p` quantile (0..=1) of `v` by nearest rank; NaN when empty.
pub(super) fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let i = ((v.len() - 1) as f64 * p).round() as usize;
    v[i.min(v.len() - 1)]
}

/// `n` deterministic token ids, distinct per `salt`, clear of the special tokens at the
/// bottom of the vocabulary (and of the top's added tokens) when the vocabulary is large
/// enough to leave them out; a tiny one (a random test config) is used whole.
pub(super) fn prompt(n: usize, salt: usize, vocab: usize) -> Vec<u32> {
    let (first, span) = if vocab > 400 {
        (200, vocab - 300)
    } else {
        (0, vocab.max(1))
    };
    (0..n.max(1))
        .map(|i| (first + (i * 7919 + salt * 104_729) % span) as u32)
        .collect()
}

/// A greedy request that generates exactly `max_tokens` (EOS ignored) in tier `tier` (the
/// bench pushes a policy whose tiers never time out in the queue).
pub(super) fn request(
    id: String,
    prompt: Vec<u32>,
    max_tokens: u32,
    session: Option<String>,
    tier: &str,
) -> GenerateRequest {
    GenerateRequest {
        id,
        prompt,
        max_tokens,
        sampling: SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            seed: Some(0),
        },
        ignore_eos: true,
        tier: tier.to_string(),
        session_id: session,
        arrived: Instant::now(),
    }
}

/// Submits `req` and reads its stream to the end.
pub(super) async fn one(engine: Arc<dyn Engine>, req: GenerateRequest) -> anyhow::Result<Timing> {
    let t0 = req.arrived;
    let admitted = engine
        .submit(req)
        .await
        .map_err(|e| anyhow::anyhow!("refused: {e}"))?;
    let mut stream = admitted.tokens;
    let mut stamps = Vec::new();
    while let Some(ev) = stream.next().await {
        match ev {
            TokenEvent::Token { .. } => stamps.push(Instant::now()),
            TokenEvent::Finished { .. } => break,
            TokenEvent::Failed { message } => anyhow::bail!("failed: {message}"),
        }
    }
    let ttft = stamps
        .first()
        .map_or(f64::NAN, |s| s.duration_since(t0).as_secs_f64());
    Ok(Timing { ttft, stamps })
}

/// Decode tokens/s while every request of a level was decoding: from the moment the last
/// one got its first token to the moment the first one got its last, tokens that arrived in
/// between ÷ that span. Prefill is outside the window, so this is the steady decode rate at
/// this concurrency. None when the window is empty (too few output tokens).
pub(super) fn steady_decode_rate(timings: &[Timing]) -> Option<f64> {
    let start = timings.iter().filter_map(|t| t.stamps.first()).max()?;
    let end = timings.iter().filter_map(|t| t.stamps.last()).min()?;
    let span = end.checked_duration_since(*start)?.as_secs_f64();
    if span <= 0.0 {
        return None;
    }
    let tokens = timings
        .iter()
        .flat_map(|t| &t.stamps)
        .filter(|s| *s > start && *s <= end)
        .count();
    Some(tokens as f64 / span)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn timing(t0: Instant, ms: &[u64]) -> Timing {
        Timing {
            ttft: 0.0,
            stamps: ms.iter().map(|&m| t0 + Duration::from_millis(m)).collect(),
        }
    }

    #[test]
    fn steady_rate_counts_only_the_window_where_all_decode() {
        let t0 = Instant::now();
        // b starts late (its prefill) and a ends early: window is 100..=300 ms.
        let a = timing(t0, &[0, 100, 200, 300]);
        let b = timing(t0, &[100, 200, 300, 400]);
        let rate = steady_decode_rate(&[a, b]).unwrap();
        // Tokens in (100, 300]: a@200, a@300, b@200, b@300 = 4 in 0.2 s.
        assert!((rate - 20.0).abs() < 1e-6, "{rate}");
    }

    #[test]
    fn prompts_stay_inside_any_vocabulary() {
        for vocab in [1, 64, 400, 401, 49_152, 128_256] {
            let p = prompt(64, 3, vocab);
            assert!(p.iter().all(|&t| (t as usize) < vocab), "vocab {vocab}");
        }
        assert!(prompt(64, 3, 128_256).iter().all(|&t| t >= 200));
    }

    #[test]
    fn steady_rate_is_none_without_a_window() {
        let t0 = Instant::now();
        assert!(steady_decode_rate(&[timing(t0, &[0])]).is_none());
        assert!(steady_decode_rate(&[]).is_none());
    }
}
