//! The ZAYA1 router and the mixture of SwiGLU experts it dispatches to.

use super::Options;
use super::layers::{Init, RmsNorm};
use crate::model::config::ModelConfig;
use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::tensor::activation::{gelu, silu, softmax};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

/// The ZAYA1 router: down-projection (+ EDA), RMSNorm, 3-layer GELU MLP, softmax.
#[derive(Module, Debug)]
pub struct Router<B: Backend> {
    /// hidden -> router dim, with bias.
    pub down_proj: Linear<B>,
    /// EDA's learned per-channel decay of the previous MoE layer's router state (absent in the
    /// first MoE layer).
    pub router_states_scale: Option<Param<Tensor<B, 1>>>,
    /// RMSNorm over the router state.
    pub rmsnorm_eda: RmsNorm<B>,
    /// The MLP: two GELU layers with bias, then routes without bias.
    pub router_mlp: Vec<Linear<B>>,
}

impl<B: Backend> Router<B> {
    /// Route probabilities `[n, routes]` and the pre-norm router state `[n, router_dim]` (the
    /// next MoE layer's EDA input) for tokens `x: [n, hidden]`.
    pub fn forward(
        &self,
        x: Tensor<B, 2>,
        previous: Option<Tensor<B, 2>>,
        eps: f64,
    ) -> (Tensor<B, 2>, Tensor<B, 2>) {
        let mut r = self.down_proj.forward(x);
        if let (Some(scale), Some(prev)) = (&self.router_states_scale, previous) {
            r = r + prev * scale.val().unsqueeze::<2>();
        }
        let mut y = self.rmsnorm_eda.forward(r.clone(), eps);
        let last = self.router_mlp.len() - 1;
        for (i, layer) in self.router_mlp.iter().enumerate() {
            y = layer.forward(y);
            if i < last {
                y = gelu(y);
            }
        }
        (softmax(y, 1), r)
    }
}

/// One SwiGLU expert: `linear_fc1` to `[gate; up]`, `silu(gate) * up`, `linear_fc2` back.
#[derive(Module, Debug)]
pub struct Expert<B: Backend> {
    /// hidden -> 2 x ffn (gate, then up).
    pub linear_fc1: Linear<B>,
    /// ffn -> hidden.
    pub linear_fc2: Linear<B>,
}

impl<B: Backend> Expert<B> {
    /// Applies the expert to `x: [n, hidden]`.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let y = self.linear_fc1.forward(x);
        let f = y.dims()[1] / 2;
        let n = y.dims()[0];
        let gate = y.clone().slice([0..n, 0..f]);
        let up = y.slice([0..n, f..2 * f]);
        self.linear_fc2.forward(silu(gate) * up)
    }
}

/// The MoE sub-layer: router, top-1 choice with balancing biases, experts, MoD skip route.
#[derive(Module, Debug)]
pub struct Moe<B: Backend> {
    /// The router.
    pub router: Router<B>,
    /// The experts.
    pub local_experts: Vec<Expert<B>>,
}

impl<B: Backend> Moe<B> {
    pub(super) fn new(
        init: &mut Init<B>,
        path: &str,
        c: &ModelConfig,
        eda: bool,
        std: f64,
        out_std: f64,
    ) -> Self {
        let (h, d) = (c.hidden_size, c.router_dim);
        let routes = c.num_experts + usize::from(c.mod_skip);
        // The router is initialised like PyTorch's nn.Linear (the reference code's modules):
        // std 1/sqrt(3 fan_in). With the 0.02 used elsewhere its probabilities start identical
        // for every token, so the balancing biases alone decide the choice and the whole batch
        // swings from expert to expert.
        let router_std = |fan_in: usize| 1.0 / (3.0 * fan_in as f64).sqrt();
        let mut mlp = Vec::new();
        for i in 0..c.router_mlp_layers {
            let last = i + 1 == c.router_mlp_layers;
            mlp.push(init.linear(
                &format!("{path}.router.router_mlp.{}", 2 * i),
                d,
                if last { routes } else { d },
                !last,
                router_std(d),
            ));
        }
        Moe {
            router: Router {
                down_proj: init.linear(
                    &format!("{path}.router.down_proj"),
                    h,
                    d,
                    true,
                    router_std(h),
                ),
                router_states_scale: eda.then(|| {
                    init.constant(&format!("{path}.router.router_states_scale"), [d], 1.0)
                }),
                rmsnorm_eda: RmsNorm::new(init, &format!("{path}.router.rmsnorm_eda"), d),
                router_mlp: mlp,
            },
            local_experts: (0..c.num_experts)
                .map(|e| {
                    let p = format!("{path}.local_experts.{e}");
                    Expert {
                        linear_fc1: init.linear(
                            &format!("{p}.linear_fc1"),
                            h,
                            2 * c.expert_ffn,
                            false,
                            std,
                        ),
                        linear_fc2: init.linear(
                            &format!("{p}.linear_fc2"),
                            c.expert_ffn,
                            h,
                            false,
                            out_std,
                        ),
                    }
                })
                .collect(),
        }
    }

    /// `x: [batch, seq, hidden]` (normed) -> (output, pre-norm router state, tokens per route).
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        router_state: Option<Tensor<B, 2>>,
        biases: &[f32],
        o: &Options,
    ) -> (Tensor<B, 3>, Tensor<B, 2>, Vec<u64>) {
        let [b, s, h] = x.dims();
        let n = b * s;
        let x = x.reshape([n, h]);
        let (probs, state) = self.router.forward(x.clone(), router_state, o.eps);
        let routes = probs.dims()[1];

        // Choice = argmax of the *detached* probabilities plus the balancing biases; the biases
        // steer the choice but never the output scale. Done on the host: it is a tiny [n, routes]
        // array, and the counting sort below needs it there anyway.
        let host: Vec<f32> = probs
            .clone()
            .detach()
            .into_data()
            .convert::<f32>()
            .into_vec()
            .expect("f32 probabilities");
        let mut choice = vec![0usize; n];
        let mut counts = vec![0u64; routes];
        for (t, row) in host.chunks_exact(routes).enumerate() {
            let mut best = 0;
            for r in 1..routes {
                if row[r] + biases[r] > row[best] + biases[best] {
                    best = r;
                }
            }
            choice[t] = best;
            counts[best] += 1;
        }

        // Dispatch: a stable counting sort of tokens by route, so each expert sees one
        // contiguous slice; the inverse permutation puts outputs back in token order.
        let mut start = vec![0usize; routes + 1];
        for r in 0..routes {
            start[r + 1] = start[r] + counts[r] as usize;
        }
        let mut next = start.clone();
        let mut order = vec![0i64; n];
        let mut inverse = vec![0i64; n];
        for (t, &r) in choice.iter().enumerate() {
            order[next[r]] = t as i64;
            inverse[t] = next[r] as i64;
            next[r] += 1;
        }
        let device = x.device();
        let index = |v: Vec<i64>| Tensor::<B, 1, Int>::from_data(TensorData::new(v, [n]), &device);
        let sorted = x.select(0, index(order));
        let mut outputs = Vec::with_capacity(routes);
        for r in 0..routes {
            let len = counts[r] as usize;
            if len == 0 {
                continue;
            }
            let rows = sorted.clone().narrow(0, start[r], len);
            // Route `num_experts` is the MoD skip: the sub-layer adds nothing, or passes the
            // normed input through (`SkipOutput`).
            outputs.push(if r < o.num_experts {
                self.local_experts[r].forward(rows)
            } else if o.skip_zero {
                rows.zeros_like()
            } else {
                rows
            });
        }
        let out = Tensor::cat(outputs, 0).select(0, index(inverse));

        // Scale by the chosen route's (unbiased, differentiable) probability.
        let chosen = Tensor::<B, 2, Int>::from_data(
            TensorData::new(choice.iter().map(|&c| c as i64).collect::<Vec<_>>(), [n, 1]),
            &device,
        );
        let prob = probs.gather(1, chosen);
        ((out * prob).reshape([b, s, h]), state, counts)
    }
}
