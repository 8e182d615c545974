"""zflow's PyTorch worker: one rank of one training phase, speaking zflow's engine contract.

The contract (``runtime/src/contract`` in the Rust tree) fixes what this package reads and
writes: the train job, the rank's environment, the JSON lines on stdout, the exit codes, the
checkpoint directories and the mixture index. This package holds the worker's side of it,
beginning with the data plane: :mod:`zflow_torch.megatron` (token datasets),
:mod:`zflow_torch.mixture` (the sample index and the batch a rank reads at a data cursor) and
:mod:`zflow_torch.rng` (the seeded shuffles they share with the Rust reader); the worker's side
of the protocol (:mod:`zflow_torch.contract`); the model (:mod:`zflow_torch.model`), the
trainer and its controls (:mod:`zflow_torch.schedule`, :mod:`zflow_torch.balance`,
:mod:`zflow_torch.spike`), checkpoints (:mod:`zflow_torch.checkpoint`) and the scorer the
evaluation harness runs (:mod:`zflow_torch.score`).
"""
