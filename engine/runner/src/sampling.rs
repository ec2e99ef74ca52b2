//! Token sampling from logits: greedy (temperature 0), temperature, nucleus (top-p), driven by
//! a small seeded PRNG so a given seed always yields the same tokens for the same logits.

/// How to pick the next token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// 0 (or less) means greedy.
    pub temperature: f32,
    /// Nucleus mass in (0, 1]; 1 disables it.
    pub top_p: f32,
    /// PRNG seed.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

/// SplitMix64: tiny, fast, good enough for sampling; deterministic per seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Approximately standard normal (sum of uniforms), for random weights.
    pub fn next_normal(&mut self) -> f32 {
        (0..12).map(|_| self.next_f32()).sum::<f32>() - 6.0
    }
}

/// Per-sequence sampler state.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
}

/// Index of the largest logit (first on ties); 0 for an empty slice.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in logits.iter().enumerate() {
        if *v > logits[best] {
            best = i;
        }
    }
    best as u32
}

impl Sampler {
    /// A sampler seeded from `params.seed`.
    pub fn new(params: SamplingParams) -> Self {
        Self {
            params,
            rng: Rng::new(params.seed),
        }
    }

    /// Picks the next token id.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let temp = self.params.temperature;
        if temp <= 0.0 || !temp.is_finite() || logits.len() < 2 {
            return argmax(logits);
        }
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut probs: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, ((l - max) / temp).exp()))
            .collect();
        let total: f32 = probs.iter().map(|p| p.1).sum();
        let top_p = self.params.top_p;
        let mass = if top_p > 0.0 && top_p < 1.0 {
            probs.sort_unstable_by(|a, b| b.1.total_cmp(&a.1));
            let mut acc = 0.0;
            let mut keep = probs.len();
            for (i, p) in probs.iter().enumerate() {
                acc += p.1;
                if acc >= top_p * total {
                    keep = i + 1;
                    break;
                }
            }
            probs.truncate(keep);
            acc.min(total)
        } else {
            total
        };
        let mut u = self.rng.next_f32() * mass;
        for &(id, p) in &probs {
            if u < p {
                return id;
            }
            u -= p;
        }
        probs.last().map_or(0, |p| p.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_and_seeded_sampling() {
        let logits = [0.1, 3.0, 0.2, 2.9];
        assert_eq!(Sampler::new(SamplingParams::default()).sample(&logits), 1);
        let p = SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            seed: 7,
        };
        let a: Vec<u32> = (0..20)
            .scan(Sampler::new(p), |s, _| Some(s.sample(&logits)))
            .collect();
        let b: Vec<u32> = (0..20)
            .scan(Sampler::new(p), |s, _| Some(s.sample(&logits)))
            .collect();
        assert_eq!(a, b);
        assert!(a.contains(&3) && a.contains(&1));
        let nucleus = SamplingParams { top_p: 0.4, ..p };
        let mut s = Sampler::new(nucleus);
        assert!((0..50).all(|_| s.sample(&logits) == 1));
    }
}
