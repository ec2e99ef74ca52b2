//! A small deterministic random number generator (SplitMix64 seeding a xorshift64*), and the
//! few distributions the simulator draws from.
//!
//! Invariants: the same seed gives the same stream on every platform; `f64()` lies in the
//! open interval (0, 1), so logarithms of it are finite.

/// xorshift64* generator.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        // SplitMix64 scrambles the seed so that small seeds give unrelated streams.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        Rng(z.max(1))
    }

    /// An independent stream derived from this seed and a label.
    pub fn fork(&self, label: u64) -> Self {
        Rng::new(self.0 ^ label.wrapping_mul(0xD6E8_FEB8_6659_FD93))
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in (0, 1).
    pub fn f64(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Uniform integer in [0, n); 0 when n is 0.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
        }
    }

    pub fn chance(&mut self, p: f64) -> bool {
        self.f64() < p
    }

    /// Exponential with the given mean.
    pub fn exp(&mut self, mean: f64) -> f64 {
        -mean * self.f64().ln()
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let (u, v) = (self.f64(), self.f64());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    /// Log-normal with the given median and shape σ.
    pub fn lognormal(&mut self, median: f64, sigma: f64) -> f64 {
        median * (sigma * self.normal()).exp()
    }

    /// Poisson with mean `lambda` (Knuth below 30, normal approximation above).
    pub fn poisson(&mut self, lambda: f64) -> u64 {
        if lambda <= 0.0 {
            return 0;
        }
        if lambda < 30.0 {
            let limit = (-lambda).exp();
            let mut k = 0;
            let mut p = self.f64();
            while p > limit {
                k += 1;
                p *= self.f64();
            }
            k
        } else {
            (lambda + lambda.sqrt() * self.normal()).round().max(0.0) as u64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_deterministic_and_means_are_right() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        assert_eq!(a.next_u64(), b.next_u64());
        let n = 200_000;
        let mean_exp = (0..n).map(|_| a.exp(3.0)).sum::<f64>() / n as f64;
        assert!((mean_exp - 3.0).abs() < 0.05, "{mean_exp}");
        let mean_p = (0..n).map(|_| a.poisson(4.0) as f64).sum::<f64>() / n as f64;
        assert!((mean_p - 4.0).abs() < 0.05, "{mean_p}");
        assert!((0..1000).all(|_| a.below(10) < 10));
    }
}
