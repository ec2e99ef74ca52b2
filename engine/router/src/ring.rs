//! Consistent hashing with bounded load (CHWBL) over the pool's engines.
//!
//! Each engine owns [`POINTS_PER_ENGINE`] points on a 64-bit ring, placed by hashing its
//! name, so the ring depends only on the set of names: adding or removing one engine moves
//! only the keys whose first point belonged to it (about 1/N of them). A key goes to the
//! first engine clockwise from its hash whose load is under the bound
//! `ceil(load_factor × (total + 1) / N)` (Mirrokni et al.): no engine takes more than
//! `load_factor` times the mean, and a key only leaves its engine while that one is full.
//!
//! Invariants: [`Ring::walk`] yields every engine exactly once, in ring order from the key;
//! a placement never returns an engine the caller's `eligible` refused.

use sha2::{Digest, Sha256};

/// Virtual points per engine: enough that N = 2..64 engines split keys within a few percent.
pub const POINTS_PER_ENGINE: usize = 160;

/// A stable 64-bit hash (SHA-256's first eight bytes): the same on every router replica
/// and across restarts, so all routers send a session to the same engine.
pub fn hash64(data: &[u8]) -> u64 {
    let digest = Sha256::digest(data);
    let mut b = [0u8; 8];
    b.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(b)
}

/// The ring of a set of engine names.
#[derive(Debug, Clone, Default)]
pub struct Ring {
    /// `(point, engine index)` sorted by point.
    points: Vec<(u64, usize)>,
    engines: usize,
}

/// Where a key was placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// Index of the chosen engine in the names given to [`Ring::new`].
    pub engine: usize,
    /// True when the key's own engine (its first on the ring) was chosen.
    pub first: bool,
}

impl Ring {
    /// A ring over `names` (indices into it are what placements return).
    pub fn new<S: AsRef<str>>(names: &[S]) -> Self {
        let mut points = Vec::with_capacity(names.len() * POINTS_PER_ENGINE);
        for (i, name) in names.iter().enumerate() {
            for p in 0..POINTS_PER_ENGINE {
                points.push((hash64(format!("{}#{p}", name.as_ref()).as_bytes()), i));
            }
        }
        points.sort_unstable();
        Ring {
            points,
            engines: names.len(),
        }
    }

    pub fn len(&self) -> usize {
        self.engines
    }

    pub fn is_empty(&self) -> bool {
        self.engines == 0
    }

    /// Engines in ring order from `key`'s hash, each once.
    pub fn walk(&self, key: u64) -> impl Iterator<Item = usize> + '_ {
        let start = self.points.partition_point(|&(p, _)| p < key);
        let mut seen = vec![false; self.engines];
        let n = self.points.len();
        (0..n).filter_map(move |i| {
            let (_, e) = self.points[(start + i) % n];
            (!std::mem::replace(&mut seen[e], true)).then_some(e)
        })
    }

    /// The first engine from `key` that `eligible` accepts and whose load is under the
    /// bound. `loads[i]` is engine i's current load; `load_factor` ≥ 1.
    pub fn place(
        &self,
        key: u64,
        loads: &[u64],
        load_factor: f64,
        eligible: impl Fn(usize) -> bool,
    ) -> Option<Placement> {
        let live: Vec<usize> = (0..self.engines).filter(|&i| eligible(i)).collect();
        if live.is_empty() {
            return None;
        }
        let total: u64 = live
            .iter()
            .map(|&i| loads.get(i).copied().unwrap_or(0))
            .sum();
        let bound = (load_factor.max(1.0) * (total + 1) as f64 / live.len() as f64).ceil() as u64;
        let mut first = true;
        for e in self.walk(key) {
            if !eligible(e) {
                // The key's own engine is not live: whatever is chosen is not its first.
                first = false;
                continue;
            }
            if loads.get(e).copied().unwrap_or(0) < bound.max(1) {
                return Some(Placement { engine: e, first });
            }
            first = false;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("engine-{i}")).collect()
    }

    #[test]
    fn walk_visits_every_engine_once() {
        let ring = Ring::new(&names(5));
        let mut seen: Vec<usize> = ring.walk(12345).collect();
        seen.sort_unstable();
        assert_eq!(seen, vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn bounded_load_holds_under_skewed_keys() {
        // Every request has the same key (one hot session): the bound still spreads them.
        let n = 4;
        let ring = Ring::new(&names(n));
        let mut loads = vec![0u64; n];
        for _ in 0..400 {
            let p = ring.place(42, &loads, 1.25, |_| true).unwrap();
            loads[p.engine] += 1;
        }
        let mean = 400.0 / n as f64;
        for &l in &loads {
            assert!(l as f64 <= (1.25 * mean).ceil() + 1.0, "{loads:?}");
        }
    }

    #[test]
    fn distinct_keys_spread_and_stay_under_the_bound() {
        let n = 3;
        let ring = Ring::new(&names(n));
        let mut loads = vec![0u64; n];
        for k in 0..3000u64 {
            let p = ring
                .place(hash64(&k.to_be_bytes()), &loads, 1.25, |_| true)
                .unwrap();
            loads[p.engine] += 1;
            let total: u64 = loads.iter().sum();
            let bound = (1.25 * total as f64 / n as f64).ceil() as u64 + 1;
            assert!(loads.iter().all(|&l| l <= bound), "{loads:?}");
        }
    }

    fn owners(ring: &Ring, keys: &[u64]) -> Vec<usize> {
        keys.iter()
            .map(|&k| ring.walk(k).next().unwrap_or(usize::MAX))
            .collect()
    }

    #[test]
    fn adding_or_removing_an_engine_remaps_about_one_nth() {
        let keys: Vec<u64> = (0..20_000u64).map(|k| hash64(&k.to_le_bytes())).collect();
        for n in [2usize, 3, 4, 8, 16] {
            let before = names(n);
            let after = names(n + 1);
            let a = owners(&Ring::new(&before), &keys);
            let b = owners(&Ring::new(&after), &keys);
            let moved = a.iter().zip(&b).filter(|(x, y)| x != y).count();
            let frac = moved as f64 / keys.len() as f64;
            let ideal = 1.0 / (n + 1) as f64;
            assert!(
                frac <= ideal + 0.05,
                "n={n}: {frac:.3} moved, ideal {ideal:.3}"
            );
            // Every moved key moved to the new engine (index n), none between old ones.
            assert!(a.iter().zip(&b).all(|(x, y)| x == y || *y == n));
            // Removing it again is the same set of keys moving back.
            let c = owners(&Ring::new(&before), &keys);
            assert_eq!(a, c);
        }
    }

    #[test]
    fn ineligible_engines_are_skipped_and_reported() {
        let ring = Ring::new(&names(3));
        let key = 7;
        let own = ring.walk(key).next().unwrap();
        let p = ring.place(key, &[0, 0, 0], 1.25, |e| e != own).unwrap();
        assert_ne!(p.engine, own);
        assert!(!p.first);
        assert!(ring.place(key, &[0, 0, 0], 1.25, |_| false).is_none());
        let p = ring.place(key, &[0, 0, 0], 1.25, |_| true).unwrap();
        assert_eq!((p.engine, p.first), (own, true));
    }
}
