//! The loss-spike guard: a step whose loss jumps far above the recent ones (a bad batch, an
//! instability) is undone by going back to the newest checkpoint and skipping that batch,
//! instead of letting one bad update derail a long run or waiting for a person to notice.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Loss-spike guard settings (`train.spike`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct SpikeGuard {
    /// Watch for spikes.
    pub enabled: bool,
    /// Steps of loss history the mean and spread come from.
    pub window: usize,
    /// A spike is a loss this many standard deviations above the window's mean...
    pub z: f64,
    /// ...and at least this many nats above it (so a flat, quiet loss curve does not turn
    /// noise into spikes).
    pub min_jump: f64,
    /// Steps of history needed before the guard judges.
    pub min_history: usize,
    /// Rollbacks allowed per phase; past that, spikes are only reported.
    pub max_rollbacks: u32,
}

impl Default for SpikeGuard {
    fn default() -> Self {
        SpikeGuard {
            enabled: true,
            window: 20,
            z: 6.0,
            min_jump: 0.5,
            min_history: 8,
            max_rollbacks: 5,
        }
    }
}
