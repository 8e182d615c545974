//! The router's balancing-bias controller.
//!
//! ZAYA1 chooses experts by `argmax(probabilities + balancing_biases)`; the biases are buffers,
//! not parameters, moved after every optimizer step by a PID-style controller whose error is the
//! realised routing distribution over the global batch minus the target (uniform). The report
//! says the controller has AdamW inside and does not publish its gains, so every gain is a
//! setting: the PID terms form a "gradient" that an Adam-normalised step applies to the biases.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Controller settings (not public in the ZAYA1 report: defaults tuned on the nano recipe).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
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
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
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
