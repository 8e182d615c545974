//! The router's balancing-bias controller.
//!
//! ZAYA1 chooses experts by `argmax(probabilities + balancing_biases)`; the biases are buffers,
//! not parameters, moved after every optimizer step by a PID-style controller whose error is the
//! realised routing distribution over the global batch minus the target (uniform). The report
//! says the controller has AdamW inside and does not publish its gains, so every gain is a
//! setting: the PID terms form a "gradient" that an Adam-normalised step applies to the biases.

use serde::{Deserialize, Serialize};

/// Controller settings (not public in the ZAYA1 report: defaults tuned on the nano recipe).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BalanceConfig {
    /// Proportional gain on `load - target`.
    pub kp: f64,
    /// Integral gain on the running sum of errors.
    pub ki: f64,
    /// Derivative gain on the change of the error since the last step.
    pub kd: f64,
    /// Step size of the Adam-normalised update (bias units per step).
    pub lr: f64,
    /// Adam's first- and second-moment decay.
    pub beta1: f64,
    /// Adam's second-moment decay.
    pub beta2: f64,
    /// Target share of the MoD skip route; `None` = uniform over every route, skip included.
    pub skip_share: Option<f64>,
    /// Turn the controller off (biases stay at their initial values).
    pub enabled: bool,
}

impl Default for BalanceConfig {
    fn default() -> Self {
        BalanceConfig {
            kp: 1.0,
            ki: 0.0,
            kd: 0.0,
            lr: 5e-3,
            beta1: 0.9,
            beta2: 0.99,
            skip_share: None,
            enabled: true,
        }
    }
}

/// Controller state for one MoE layer; serialised into checkpoints.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BalanceState {
    /// The biases added to the detached router probabilities before the argmax.
    pub biases: Vec<f32>,
    /// Running sum of errors (the I term).
    pub integral: Vec<f64>,
    /// Last error (for the D term).
    pub last_error: Vec<f64>,
    /// Adam moments.
    pub m: Vec<f64>,
    /// Adam second moments.
    pub v: Vec<f64>,
    /// Updates applied so far (Adam's bias correction).
    pub steps: u64,
}

impl BalanceState {
    /// Initial state for `routes` routes; with the MoD skip route (the last one) its bias starts
    /// at -1 as in ZAYA1, so early training sends few tokens past the experts.
    pub fn new(routes: usize, mod_skip: bool) -> Self {
        let mut biases = vec![0.0; routes];
        if mod_skip {
            biases[routes - 1] = -1.0;
        }
        BalanceState {
            biases,
            integral: vec![0.0; routes],
            last_error: vec![0.0; routes],
            m: vec![0.0; routes],
            v: vec![0.0; routes],
            steps: 0,
        }
    }
}

/// The target share of each route.
pub fn target_shares(routes: usize, mod_skip: bool, config: &BalanceConfig) -> Vec<f64> {
    match (mod_skip, config.skip_share) {
        (true, Some(skip)) => {
            let mut t = vec![(1.0 - skip) / (routes - 1) as f64; routes];
            t[routes - 1] = skip;
            t
        }
        _ => vec![1.0 / routes as f64; routes],
    }
}

/// Realised share of each route from token counts (all zeros stay zeros).
pub fn shares(counts: &[u64]) -> Vec<f64> {
    let total: u64 = counts.iter().sum();
    counts
        .iter()
        .map(|&c| {
            if total == 0 {
                0.0
            } else {
                c as f64 / total as f64
            }
        })
        .collect()
}

/// Load-balance error: the total-variation distance between the realised and target routing
/// distributions (0 = perfectly balanced, 1 - target = every token on one route).
pub fn balance_error(counts: &[u64], target: &[f64]) -> f64 {
    0.5 * shares(counts)
        .iter()
        .zip(target)
        .map(|(s, t)| (s - t).abs())
        .sum::<f64>()
}

/// One controller update from the global batch's per-route token counts.
pub fn update(state: &mut BalanceState, counts: &[u64], target: &[f64], config: &BalanceConfig) {
    if !config.enabled || counts.iter().sum::<u64>() == 0 {
        return;
    }
    let load = shares(counts);
    state.steps += 1;
    let t = state.steps as i32;
    for i in 0..state.biases.len() {
        // Positive error = overloaded route = its bias must fall.
        let error = load[i] - target[i];
        state.integral[i] += error;
        let derivative = error - state.last_error[i];
        state.last_error[i] = error;
        let g = config.kp * error + config.ki * state.integral[i] + config.kd * derivative;
        state.m[i] = config.beta1 * state.m[i] + (1.0 - config.beta1) * g;
        state.v[i] = config.beta2 * state.v[i] + (1.0 - config.beta2) * g * g;
        let m_hat = state.m[i] / (1.0 - config.beta1.powi(t));
        let v_hat = state.v[i] / (1.0 - config.beta2.powi(t));
        state.biases[i] -= (config.lr * m_hat / (v_hat.sqrt() + 1e-12)) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_is_total_variation() {
        let target = vec![0.25; 4];
        assert_eq!(balance_error(&[1, 1, 1, 1], &target), 0.0);
        assert!((balance_error(&[4, 0, 0, 0], &target) - 0.75).abs() < 1e-12);
    }

    #[test]
    fn overloaded_route_loses_bias() {
        let config = BalanceConfig::default();
        let mut s = BalanceState::new(3, false);
        let target = target_shares(3, false, &config);
        update(&mut s, &[8, 1, 1], &target, &config);
        assert!(s.biases[0] < 0.0 && s.biases[1] > 0.0 && s.biases[2] > 0.0);
    }

    #[test]
    fn skip_route_starts_at_minus_one_and_can_have_its_own_share() {
        let config = BalanceConfig {
            skip_share: Some(0.2),
            ..Default::default()
        };
        let s = BalanceState::new(5, true);
        assert_eq!(s.biases, vec![0.0, 0.0, 0.0, 0.0, -1.0]);
        let t = target_shares(5, true, &config);
        assert!((t[4] - 0.2).abs() < 1e-12 && (t[0] - 0.2).abs() < 1e-12);
    }
}
