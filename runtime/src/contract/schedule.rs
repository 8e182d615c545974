//! The warmup-stable-decay (WSD) learning-rate schedule, one per training phase.
//!
//! ZAYA1's schedule is not public; WSD is the recipe's default because a phase can be extended
//! (or a later phase started) from any point of the stable part without re-warming.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How the decay part falls from the peak to the floor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DecayShape {
    /// Straight line.
    Linear,
    /// Half a cosine.
    Cosine,
    /// `1 - sqrt(progress)`: drops fast, then flattens (Hägele et al. 2024).
    Sqrt,
}

/// A WSD schedule over `total_steps` optimizer steps.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct WsdSchedule {
    /// Peak learning rate, reached at the end of warmup.
    pub peak_lr: f64,
    /// Warmup length as a fraction of the phase's steps (linear from 0).
    pub warmup: f64,
    /// Decay length as a fraction of the phase's steps, at the end of the phase.
    pub decay: f64,
    /// Floor at the end of decay, as a fraction of `peak_lr`.
    pub min_lr_ratio: f64,
    /// Shape of the decay.
    pub decay_shape: DecayShape,
}

impl Default for WsdSchedule {
    fn default() -> Self {
        WsdSchedule {
            peak_lr: 3e-3,
            warmup: 0.05,
            decay: 0.2,
            min_lr_ratio: 0.1,
            decay_shape: DecayShape::Sqrt,
        }
    }
}

impl WsdSchedule {
    /// Checks the settings, naming the bad field.
    pub fn validate(&self) -> Result<(), String> {
        let frac = |name: &str, v: f64| {
            if (0.0..=1.0).contains(&v) {
                Ok(())
            } else {
                Err(format!("`{name}` must be in [0, 1], got {v}"))
            }
        };
        frac("warmup", self.warmup)?;
        frac("decay", self.decay)?;
        frac("min_lr_ratio", self.min_lr_ratio)?;
        if self.warmup + self.decay > 1.0 {
            return Err(format!(
                "`warmup` + `decay` must be at most 1, got {}",
                self.warmup + self.decay
            ));
        }
        if !(self.peak_lr > 0.0 && self.peak_lr.is_finite()) {
            return Err(format!(
                "`peak_lr` must be a positive number, got {}",
                self.peak_lr
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_fractions_by_name() {
        let s = WsdSchedule {
            warmup: 0.9,
            decay: 0.2,
            ..Default::default()
        };
        assert!(s.validate().unwrap_err().contains("`warmup` + `decay`"));
        let s = WsdSchedule {
            min_lr_ratio: 2.0,
            ..Default::default()
        };
        assert!(s.validate().unwrap_err().contains("min_lr_ratio"));
    }
}
