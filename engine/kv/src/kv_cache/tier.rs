//! Tier settings the KV cache and the scheduler act on: priority, queue-wait target, idle TTL,
//! the action taken on an idle session's KV under pressure, and the expected chance that a
//! session returns.
//!
//! Invariant: a [`Tiers`] table is never empty and its default index is valid, so every
//! lookup by [`TierId`] answers (an unknown id falls back to the default tier).

/// Index of a tier in a [`Tiers`] table.
pub type TierId = usize;

/// What happens to an idle session's KV blocks when the TTL expires or blocks run short.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PressureAction {
    /// Keep the blocks resident while any other tier can be evicted instead; when pressure
    /// still forces it, behave as `Drop`. The TTL does not evict a retained session.
    Retain,
    /// Copy the blocks to host RAM (then spill to disk files), free them, restore on return.
    #[default]
    Offload,
    /// Free the blocks; recompute by prefill when the session returns.
    Drop,
}

/// One tier, as the KV cache and scheduler need it.
#[derive(Clone, Debug, PartialEq)]
pub struct TierConfig {
    /// Tier name (metrics label).
    pub name: String,
    /// Higher is scheduled first and preempted last.
    pub priority: i32,
    /// Idle time after which an idle session's KV gets `on_pressure`'s action anyway.
    pub idle_ttl_ms: u64,
    /// Action on idle KV under pressure or at TTL.
    pub on_pressure: PressureAction,
    /// Chance that an idle session of this tier comes back right after it ends (0..=1); the
    /// cost model decays it with idle time.
    pub return_probability: f64,
    /// A request of this tier not yet admitted after waiting this long is refused (the
    /// scheduler expires it on its clock). A pushed TierPolicy always sets it.
    pub queue_wait_ms: u64,
}

/// Queue-wait target of a tier built with [`TierConfig::new`]: none (requests wait until
/// admitted), so a hand-built table never refuses anyone by surprise.
pub const NO_QUEUE_WAIT_TARGET: u64 = u64::MAX;

impl TierConfig {
    /// A tier with the given name, priority, TTL and action, a 50% return probability and no
    /// queue-wait target.
    pub fn new(name: &str, priority: i32, idle_ttl_ms: u64, on_pressure: PressureAction) -> Self {
        TierConfig {
            name: name.to_string(),
            priority,
            idle_ttl_ms,
            on_pressure,
            return_probability: 0.5,
            queue_wait_ms: NO_QUEUE_WAIT_TARGET,
        }
    }
}

/// A non-empty table of tiers with a default.
#[derive(Clone, Debug, PartialEq)]
pub struct Tiers {
    tiers: Vec<TierConfig>,
    default: TierId,
}

impl Default for Tiers {
    fn default() -> Self {
        Tiers {
            tiers: vec![TierConfig::new(
                "default",
                0,
                600_000,
                PressureAction::Offload,
            )],
            default: 0,
        }
    }
}

impl Tiers {
    /// A table of `tiers` whose default is the one named `default`; `None` if `tiers` is empty
    /// or no tier has that name.
    pub fn new(tiers: Vec<TierConfig>, default: &str) -> Option<Self> {
        let default = tiers.iter().position(|t| t.name == default)?;
        Some(Tiers { tiers, default })
    }

    /// The tier `id`, or the default tier for an unknown id.
    pub fn get(&self, id: TierId) -> &TierConfig {
        self.tiers
            .get(id)
            .or_else(|| self.tiers.get(self.default))
            .unwrap_or(&FALLBACK)
    }

    /// The id of the tier named `name`.
    pub fn id_of(&self, name: &str) -> Option<TierId> {
        self.tiers.iter().position(|t| t.name == name)
    }

    /// The default tier's id.
    pub fn default_id(&self) -> TierId {
        self.default
    }

    /// All tiers, indexed by id.
    pub fn all(&self) -> &[TierConfig] {
        &self.tiers
    }
}

static FALLBACK: TierConfig = TierConfig {
    name: String::new(),
    priority: 0,
    idle_ttl_ms: 0,
    on_pressure: PressureAction::Drop,
    return_probability: 0.0,
    queue_wait_ms: NO_QUEUE_WAIT_TARGET,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_id_falls_back_to_default() {
        let t = Tiers::new(
            vec![
                TierConfig::new("free", 0, 1000, PressureAction::Drop),
                TierConfig::new("pro", 10, 1000, PressureAction::Offload),
            ],
            "pro",
        )
        .unwrap();
        assert_eq!(t.get(0).name, "free");
        assert_eq!(t.get(7).name, "pro");
        assert_eq!(t.id_of("free"), Some(0));
        assert!(Tiers::new(vec![], "x").is_none());
    }
}
