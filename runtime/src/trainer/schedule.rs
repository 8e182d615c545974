//! The warmup-stable-decay (WSD) learning-rate schedule, one per training phase.
//!
//! ZAYA1's schedule is not public; WSD is the recipe's default because a phase can be extended
//! (or a later phase started) from any point of the stable part without re-warming.

use serde::{Deserialize, Serialize};

/// How the decay part falls from the peak to the floor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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

    /// The learning rate at optimizer step `step` (0-based) of `total_steps`.
    pub fn lr(&self, step: u64, total_steps: u64) -> f64 {
        let total = total_steps.max(1) as f64;
        let warmup = (self.warmup * total).round();
        let decay = (self.decay * total).round();
        let s = step as f64;
        let floor = self.peak_lr * self.min_lr_ratio;
        if s < warmup {
            return self.peak_lr * (s + 1.0) / warmup;
        }
        let decay_start = total - decay;
        if s < decay_start || decay == 0.0 {
            return self.peak_lr;
        }
        let progress = ((s - decay_start + 1.0) / decay).clamp(0.0, 1.0);
        let fall = match self.decay_shape {
            DecayShape::Linear => progress,
            DecayShape::Cosine => 0.5 * (1.0 - (std::f64::consts::PI * progress).cos()),
            DecayShape::Sqrt => progress.sqrt(),
        };
        floor + (self.peak_lr - floor) * (1.0 - fall)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warms_up_holds_then_decays_to_the_floor() {
        let s = WsdSchedule {
            peak_lr: 1.0,
            warmup: 0.1,
            decay: 0.2,
            min_lr_ratio: 0.1,
            decay_shape: DecayShape::Linear,
        };
        assert!((s.lr(0, 100) - 0.1).abs() < 1e-12);
        assert!((s.lr(9, 100) - 1.0).abs() < 1e-12);
        assert_eq!(s.lr(50, 100), 1.0);
        assert_eq!(s.lr(79, 100), 1.0);
        assert!((s.lr(89, 100) - 0.55).abs() < 1e-12);
        assert!((s.lr(99, 100) - 0.1).abs() < 1e-12);
        // Monotone non-increasing after warmup for every shape.
        for shape in [DecayShape::Linear, DecayShape::Cosine, DecayShape::Sqrt] {
            let s = WsdSchedule {
                decay_shape: shape,
                ..s.clone()
            };
            let lrs: Vec<f64> = (10..100).map(|i| s.lr(i, 100)).collect();
            assert!(lrs.windows(2).all(|w| w[1] <= w[0] + 1e-15), "{shape:?}");
        }
    }

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
