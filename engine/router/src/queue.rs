//! The router's tier-priority queue: requests waiting for an engine with room.
//!
//! Order: highest effective priority first, where effective priority is the tier's
//! priority plus `aging_per_second` for every second waited, so a low tier is never
//! starved by a steady stream of a higher one; FIFO within a tier (equal priority, the
//! older one has aged more). The queue is bounded; each entry carries its own deadline
//! (the tier's queue-wait target, or the hold timeout while the pool has no engine).
//!
//! Invariants: an entry leaves exactly once — popped for dispatch, expired, or removed by
//! its waiter; `len()` counts only entries still waiting. Time is passed in (no clock
//! here), so ordering and expiry are tested without sleeping.

use std::time::Instant;

/// One waiting request.
#[derive(Debug)]
pub struct Entry<T> {
    pub id: u64,
    pub priority: i64,
    pub arrived: Instant,
    pub deadline: Instant,
    /// True for a request held because no engine was ready (scale from zero).
    pub held: bool,
    pub item: T,
}

/// Why an entry was not queued.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    Full,
}

/// The bounded priority queue (linear scan: it holds at most a few hundred entries, and a
/// pop is once per finished request).
#[derive(Debug)]
pub struct TierQueue<T> {
    entries: Vec<Entry<T>>,
    bound: usize,
    aging_per_second: f64,
}

impl<T> TierQueue<T> {
    pub fn new(bound: usize, aging_per_second: f64) -> Self {
        TierQueue {
            entries: Vec::new(),
            bound,
            aging_per_second,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn held(&self) -> usize {
        self.entries.iter().filter(|e| e.held).count()
    }

    /// Queues `entry` unless the queue is at its bound.
    pub fn push(&mut self, entry: Entry<T>) -> Result<(), (Refused, Entry<T>)> {
        if self.entries.len() >= self.bound {
            return Err((Refused::Full, entry));
        }
        self.entries.push(entry);
        Ok(())
    }

    fn rank(&self, e: &Entry<T>, now: Instant) -> f64 {
        let waited = now.saturating_duration_since(e.arrived).as_secs_f64();
        e.priority as f64 + self.aging_per_second * waited
    }

    /// Index of the entry to serve next among those `fits` accepts.
    fn best(&self, now: Instant, fits: impl Fn(&T) -> bool) -> Option<usize> {
        let mut best: Option<(usize, f64)> = None;
        for (i, e) in self.entries.iter().enumerate() {
            if e.deadline <= now || !fits(&e.item) {
                continue;
            }
            let r = self.rank(e, now);
            let better = match best {
                None => true,
                // Ties: the earlier arrival (FIFO).
                Some((j, rb)) => r > rb || (r == rb && e.arrived < self.entries[j].arrived),
            };
            if better {
                best = Some((i, r));
            }
        }
        best.map(|(i, _)| i)
    }

    /// Removes and returns the next entry to serve (expired ones are skipped, not returned;
    /// see [`TierQueue::expire`]).
    pub fn pop(&mut self, now: Instant, fits: impl Fn(&T) -> bool) -> Option<Entry<T>> {
        let i = self.best(now, fits)?;
        Some(self.entries.swap_remove(i))
    }

    /// Removes the entry `id` (its waiter gave up); None when it already left.
    pub fn remove(&mut self, id: u64) -> Option<Entry<T>> {
        let i = self.entries.iter().position(|e| e.id == id)?;
        Some(self.entries.swap_remove(i))
    }

    /// Removes and returns every entry past its deadline.
    pub fn expire(&mut self, now: Instant) -> Vec<Entry<T>> {
        let mut gone = Vec::new();
        let mut i = 0;
        while i < self.entries.len() {
            if self.entries[i].deadline <= now {
                gone.push(self.entries.swap_remove(i));
            } else {
                i += 1;
            }
        }
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn entry(id: u64, priority: i64, arrived: Instant, wait_s: u64) -> Entry<u64> {
        Entry {
            id,
            priority,
            arrived,
            deadline: arrived + Duration::from_secs(wait_s),
            held: false,
            item: id,
        }
    }

    #[test]
    fn higher_tier_first_then_fifo() {
        let t0 = Instant::now();
        let mut q = TierQueue::new(10, 0.0);
        q.push(entry(1, 1, t0, 60)).unwrap();
        q.push(entry(2, 100, t0 + Duration::from_millis(1), 60))
            .unwrap();
        q.push(entry(3, 1, t0 + Duration::from_millis(2), 60))
            .unwrap();
        q.push(entry(4, 100, t0 + Duration::from_millis(3), 60))
            .unwrap();
        let now = t0 + Duration::from_millis(10);
        let order: Vec<u64> = std::iter::from_fn(|| q.pop(now, |_| true).map(|e| e.id)).collect();
        assert_eq!(order, vec![2, 4, 1, 3]);
    }

    #[test]
    fn aging_lifts_a_long_waiting_low_tier() {
        let t0 = Instant::now();
        let mut q = TierQueue::new(10, 20.0);
        q.push(entry(1, 1, t0, 60)).unwrap();
        // Ten seconds later an enterprise request arrives: the free one has aged 200 points.
        let later = t0 + Duration::from_secs(10);
        q.push(entry(2, 100, later, 60)).unwrap();
        assert_eq!(q.pop(later, |_| true).map(|e| e.id), Some(1));
        // Without aging, the enterprise one would have gone first.
        let mut q = TierQueue::new(10, 0.0);
        q.push(entry(1, 1, t0, 60)).unwrap();
        q.push(entry(2, 100, later, 60)).unwrap();
        assert_eq!(q.pop(later, |_| true).map(|e| e.id), Some(2));
    }

    #[test]
    fn bound_deadline_and_removal() {
        let t0 = Instant::now();
        let mut q = TierQueue::new(2, 0.0);
        q.push(entry(1, 1, t0, 1)).unwrap();
        q.push(entry(2, 1, t0, 5)).unwrap();
        let (why, back) = q.push(entry(3, 1, t0, 5)).unwrap_err();
        assert_eq!((why, back.id), (Refused::Full, 3));
        // Past entry 1's deadline it is never popped, and expire returns it once.
        let now = t0 + Duration::from_secs(2);
        assert_eq!(q.pop(now, |&id| id == 1).map(|e| e.id), None);
        let gone: Vec<u64> = q.expire(now).into_iter().map(|e| e.id).collect();
        assert_eq!(gone, vec![1]);
        assert!(q.expire(now).is_empty());
        assert_eq!(q.remove(2).map(|e| e.id), Some(2));
        assert!(q.remove(2).is_none());
        assert!(q.is_empty());
    }

    #[test]
    fn pop_skips_entries_that_do_not_fit() {
        let t0 = Instant::now();
        let mut q = TierQueue::new(4, 0.0);
        q.push(entry(1, 100, t0, 60)).unwrap();
        q.push(entry(2, 1, t0, 60)).unwrap();
        assert_eq!(q.pop(t0, |&id| id != 1).map(|e| e.id), Some(2));
        assert_eq!(q.len(), 1);
    }
}
