//! The exchanges of a data-parallel ZeRO-1 step over the [`Group`] ring.
//!
//! The parameters are regrouped by owning rank ([`Plan`]) so that each rank's optimizer shard
//! is one contiguous block of a flat buffer. Then per step:
//!
//! 1. a small all-reduce of what the step measured: which parameters got a gradient (an expert
//!    no token reached gets none), the loss, the routing counts;
//! 2. a reduce-scatter of the gradients: each rank ends with the summed gradients of the
//!    parameters it owns, and nothing else (the optimizer only ever sees its own shard);
//! 3. the global gradient norm from each rank's share (all-gathered, summed in rank order);
//! 4. after the update, an all-gather of the parameters: every owner's new values to everyone.
//!
//! Traffic per step is that of one all-reduce of the model (2 x (world-1)/world x parameters),
//! as for plain data parallelism, while the optimizer state per rank shrinks by `world`.

use std::ops::Range;

use anyhow::Result;
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData};

use crate::dist::collective::Group;
use crate::dist::zero::Layout;
use crate::model::Zaya;

/// Where each parameter sits in the flat exchange buffer.
pub struct Plan {
    /// Owning rank per parameter (visiting order).
    pub owner: Vec<usize>,
    /// Elements per parameter.
    pub sizes: Vec<usize>,
    /// Offset per parameter in the flat buffer (grouped by owner).
    pub offsets: Vec<usize>,
    /// Each rank's block of the flat buffer.
    pub blocks: Vec<Range<usize>>,
    /// Elements in all.
    pub total: usize,
}

impl Plan {
    /// The plan of `layout`.
    pub fn new(layout: &Layout) -> Plan {
        let owner: Vec<usize> = layout.params.iter().map(|s| s.owner).collect();
        let sizes: Vec<usize> = layout.params.iter().map(|s| s.numel).collect();
        let mut offsets = vec![0; sizes.len()];
        let mut blocks = Vec::with_capacity(layout.dp);
        let mut at = 0;
        for rank in 0..layout.dp {
            let start = at;
            for (i, s) in layout.params.iter().enumerate() {
                if s.owner == rank {
                    offsets[i] = at;
                    at += s.numel;
                }
            }
            blocks.push(start..at);
        }
        Plan {
            owner,
            sizes,
            offsets,
            blocks,
            total: at,
        }
    }

    fn range(&self, i: usize) -> Range<usize> {
        self.offsets[i]..self.offsets[i] + self.sizes[i]
    }
}

/// What a step measured on one rank; after [`exchange_gradients`], over all ranks.
pub struct StepSums {
    /// Mean micro-batch loss (after the exchange: the mean over ranks).
    pub loss: f64,
    /// Tokens per route per MoE layer (after the exchange: summed over ranks).
    pub counts: Vec<Vec<u64>>,
}

/// Turns this rank's accumulated gradients into the mean gradients over all ranks of the
/// parameters this rank owns (the rest are dropped), and sums what the step measured.
/// Returns them with the global gradient norm.
pub fn exchange_gradients<B: AutodiffBackend>(
    group: &mut Group,
    plan: &Plan,
    model: &Zaya<B>,
    grads: GradientsParams,
    sums: StepSums,
) -> Result<(GradientsParams, StepSums, f64)> {
    let world = group.world;
    // 1. Flat gradients (zeros where a parameter got none) and the measurements.
    struct Flatten<'a, B: AutodiffBackend> {
        plan: &'a Plan,
        grads: GradientsParams,
        buf: Vec<f32>,
        flags: Vec<f32>,
        index: usize,
        _b: std::marker::PhantomData<B>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Flatten<'_, B> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            let range = self.plan.range(self.index);
            let got = self.grads.remove::<B::InnerBackend, D>(p.id);
            self.flags.push(f32::from(u8::from(got.is_some())));
            if let Some(g) = got {
                let values = g
                    .into_data()
                    .convert::<f32>()
                    .into_vec::<f32>()
                    .expect("f32 gradients");
                self.buf[range].copy_from_slice(&values);
            }
            self.index += 1;
        }
    }
    let mut flat = Flatten::<B> {
        plan,
        grads,
        buf: vec![0.0; plan.total],
        flags: Vec::new(),
        index: 0,
        _b: std::marker::PhantomData,
    };
    model.visit(&mut flat);
    let Flatten {
        mut buf, mut flags, ..
    } = flat;

    // Counts travel as two parts below 2^12, exact in f32 up to 2^36 tokens per route.
    let params = flags.len();
    flags.push(sums.loss as f32);
    for layer in &sums.counts {
        for &c in layer {
            flags.push((c >> 12) as f32);
            flags.push((c & 0xfff) as f32);
        }
    }
    group.all_reduce_sum(&mut flags)?;
    let loss = flags[params] as f64 / world as f64;
    let mut counts = sums.counts;
    let mut at = params + 1;
    for layer in counts.iter_mut() {
        for c in layer.iter_mut() {
            *c = ((flags[at] as u64) << 12) + flags[at + 1] as u64;
            at += 2;
        }
    }

    // 2. Each rank gets the sums of its own block, and takes the mean.
    group.reduce_scatter(&mut buf, &plan.blocks)?;
    let mine = plan.blocks[group.rank].clone();
    let scale = 1.0 / world as f32;
    buf[mine.clone()].iter_mut().for_each(|x| *x *= scale);

    // 3. The global norm: each rank's sum of squares, gathered and added in rank order.
    let own_sq: f64 = (0..params)
        .filter(|&i| plan.owner[i] == group.rank && flags[i] > 0.0)
        .flat_map(|i| buf[plan.range(i)].iter())
        .map(|&x| x as f64 * x as f64)
        .sum();
    let mut norms = vec![0.0f32; 2 * world];
    let hi = own_sq as f32;
    norms[2 * group.rank] = hi;
    norms[2 * group.rank + 1] = (own_sq - hi as f64) as f32;
    let pairs: Vec<Range<usize>> = (0..world).map(|r| 2 * r..2 * r + 2).collect();
    group.all_gather(&mut norms, &pairs)?;
    let norm = norms.iter().map(|&x| x as f64).sum::<f64>().sqrt();

    // 4. This rank's gradients as tensors again.
    struct Unflatten<'a, B: AutodiffBackend> {
        plan: &'a Plan,
        buf: &'a [f32],
        flags: &'a [f32],
        rank: usize,
        index: usize,
        out: GradientsParams,
        _b: std::marker::PhantomData<B>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Unflatten<'_, B> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            let i = self.index;
            self.index += 1;
            if self.plan.owner[i] != self.rank || self.flags[i] == 0.0 {
                return;
            }
            let value = p.val().inner();
            let values = self.buf[self.plan.range(i)].to_vec();
            let g = Tensor::<B::InnerBackend, D>::from_data(
                TensorData::new(values, value.shape()),
                &value.device(),
            );
            self.out.register::<B::InnerBackend, D>(p.id, g);
        }
    }
    let mut un = Unflatten::<B> {
        plan,
        buf: &buf,
        flags: &flags,
        rank: group.rank,
        index: 0,
        out: GradientsParams::new(),
        _b: std::marker::PhantomData,
    };
    model.visit(&mut un);
    Ok((un.out, StepSums { loss, counts }, norm))
}

/// Gives every rank every owner's updated parameters.
pub fn all_gather_parameters<B: AutodiffBackend>(
    group: &mut Group,
    plan: &Plan,
    model: Zaya<B>,
) -> Result<Zaya<B>> {
    struct Flatten<'a, B: AutodiffBackend> {
        plan: &'a Plan,
        rank: usize,
        buf: Vec<f32>,
        index: usize,
        _b: std::marker::PhantomData<B>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Flatten<'_, B> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            let i = self.index;
            self.index += 1;
            if self.plan.owner[i] == self.rank {
                let values = p
                    .val()
                    .inner()
                    .into_data()
                    .convert::<f32>()
                    .into_vec::<f32>()
                    .expect("f32 weights");
                self.buf[self.plan.range(i)].copy_from_slice(&values);
            }
        }
    }
    let mut flat = Flatten::<B> {
        plan,
        rank: group.rank,
        buf: vec![0.0; plan.total],
        index: 0,
        _b: std::marker::PhantomData,
    };
    model.visit(&mut flat);
    let mut buf = flat.buf;
    group.all_gather(&mut buf, &plan.blocks)?;

    struct Scatter<'a> {
        plan: &'a Plan,
        rank: usize,
        buf: &'a [f32],
        index: usize,
    }
    impl<B: AutodiffBackend> ModuleMapper<B> for Scatter<'_> {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let i = self.index;
            self.index += 1;
            if self.plan.owner[i] == self.rank {
                return param;
            }
            let (id, old, _) = param.consume();
            let values = self.buf[self.plan.range(i)].to_vec();
            let t = Tensor::<B, D>::from_data(TensorData::new(values, old.shape()), &old.device());
            Param::initialized(
                id,
                if old.is_require_grad() {
                    t.require_grad()
                } else {
                    t
                },
            )
        }
    }
    Ok(model.map(&mut Scatter {
        plan,
        rank: group.rank,
        buf: &buf,
        index: 0,
    }))
}
