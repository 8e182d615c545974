//! The loss-spike guard: a step whose loss jumps far above the recent ones (a bad batch, an
//! instability) is undone by going back to the newest checkpoint and skipping that batch,
//! instead of letting one bad update derail a long run or waiting for a person to notice.

use serde::{Deserialize, Serialize};

/// Loss-spike guard settings (`train.spike`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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

impl SpikeGuard {
    /// The z-score of `loss` against `history` if it is a spike.
    pub fn check(&self, history: &[f64], loss: f64) -> Option<f64> {
        if !self.enabled || history.len() < self.min_history.max(2) {
            return None;
        }
        let recent = &history[history.len().saturating_sub(self.window)..];
        let n = recent.len() as f64;
        let mean = recent.iter().sum::<f64>() / n;
        let std = (recent.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
        let z = (loss - mean) / std.max(1e-6);
        (!loss.is_finite() || (z > self.z && loss - mean > self.min_jump))
            .then_some(if loss.is_finite() { z } else { f64::INFINITY })
    }

    /// Appends `loss` to `history`, keeping the last `window`.
    pub fn record(&self, history: &mut Vec<f64>, loss: f64) {
        history.push(loss);
        let excess = history.len().saturating_sub(self.window.max(1));
        history.drain(..excess);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_jumps_not_a_falling_curve_or_noise() {
        let g = SpikeGuard::default();
        let mut h = Vec::new();
        // A steeply falling early curve with noise: no spikes.
        for i in 0..30 {
            let loss = 9.0 - 0.1 * i as f64 + if i % 2 == 0 { 0.05 } else { -0.05 };
            assert_eq!(g.check(&h, loss), None, "step {i}");
            g.record(&mut h, loss);
        }
        assert_eq!(h.len(), 20);
        // A jump far above the recent losses (8.0 -> 6.1, sd 0.6) is a spike; so is a NaN.
        assert_eq!(
            g.check(&h, 9.0),
            None,
            "3 sd is within a falling curve's spread"
        );
        let z = g.check(&h, 12.0).unwrap();
        assert!(z > 6.0, "{z}");
        assert_eq!(g.check(&h, f64::NAN), Some(f64::INFINITY));
        // Flat and quiet: a tiny rise is not a spike although its z is huge.
        let flat = vec![5.0; 10];
        assert_eq!(g.check(&flat, 5.01), None);
        assert!(
            SpikeGuard {
                enabled: false,
                ..g
            }
            .check(&h, 12.0)
            .is_none()
        );
    }
}
