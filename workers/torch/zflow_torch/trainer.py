"""The torch engine's trainer: one phase on one rank (``zflow_torch.worker`` starts it). It
keeps zflow's engine contract (``runtime/src/contract``): the train job, the environment, the
JSON lines on stdout, the exit codes, the checkpoint format, the data order.

A step: ``global_batch / (world x
micro_batch)`` micro-batches read through the data cursor, their gradients accumulated and
averaged over the ranks (DistributedDataParallel: bucketed all-reduce overlapped with the
backward pass; in bf16 with f32 sums where ``train.grad_reduce_dtype`` says so, ``reduce.py``),
clipped by global norm, then Muon (torch.optim.Muon, RMS-matched to AdamW) on
the 2-D weight matrices and AdamW on the rest, at the WSD learning rate, each rank updating
only the tensors it owns (ZeRO-1, ``checkpoint.layout``) and broadcasting them to the others.
After the update the balancing controller moves the router biases from the step's global
routing counts.
"""

import contextlib
import errno
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import nn

from zflow_torch import (
    activation_checkpointing,
    balance,
    checkpoint,
    context_parallel,
    faults,
    model,
    reduce,
    schedule,
    spike,
)
from zflow_torch.context_parallel import ContextParallel
from zflow_torch.contract import (
    PREFLIGHT,
    RANK,
    WORLD,
    Emitter,
    Fatal,
    JobError,
    PeerLost,
    log,
    read_job,
)
from zflow_torch.distributed import (
    allreduce_busbw,
    describe,
    device_for,
    device_index,
    join_group,
    link_bandwidths,
    probe,
    ranks_per_node,
)
from zflow_torch.job import TrainJob, encode
from zflow_torch.loss import CausalLmLoss
from zflow_torch.megatron import Tokens, first_tokens
from zflow_torch.mixture import DataCursor, MixtureReader
from zflow_torch.optim import BatchedMuon
from zflow_torch.rng import SplitMix64
from zflow_torch.state import State


class Trainer:
    """One phase on one rank."""

    def __init__(self, job: TrainJob, backend: str, emit: Emitter) -> None:
        self.job, self.emit = job, emit
        self.t = job.train
        self.rank = int(os.environ.get(RANK, "0"))
        self.world = int(os.environ.get(WORLD, "1"))
        self.device = device_for(backend, device_index())
        self.faults = faults.Faults.from_env(self.rank)
        t = self.t
        # Context parallelism: consecutive ranks split each sequence (a group of
        # `context_parallel`); the data is read by data-parallel index.
        self.cp_size = job.context_parallel
        if self.cp_size < 1 or self.world % self.cp_size != 0:
            raise Fatal(
                f"phase `{job.phase}`: context_parallel {self.cp_size} does not divide "
                f"{self.world} ranks"
            )
        self.dp_rank, self.dp_world = self.rank // self.cp_size, self.world // self.cp_size
        if t.global_batch % (self.dp_world * t.micro_batch) != 0:
            raise Fatal(
                f"phase `{job.phase}`: global_batch {t.global_batch} is not a multiple of "
                f"{self.dp_world} data-parallel groups x micro_batch {t.micro_batch}"
            )
        self.accumulation = t.global_batch // (self.dp_world * t.micro_batch)
        # The phase's model, resolved by the train stage (`TrainJob::phase_model`).
        self.model_config = job.model
        try:
            model.check_supported(self.model_config)
        except model.UnsupportedModel as e:
            raise Fatal(str(e)) from e
        self.checkpoints = Path(job.checkpoints)

    # -- set-up ---------------------------------------------------------------------------------

    def open_data(self) -> None:
        # A source's tokens: its datasets (a sharded source's shards) read as one.
        self.reader = MixtureReader(Path(self.job.mixture), [s.tokens for s in self.job.sources])
        self.seq_len = self.reader.seq_len
        self.total_steps = self.reader.num_samples // self.t.global_batch
        if self.total_steps == 0:
            raise Fatal(
                f"phase `{self.job.phase}`: the mixture has {self.reader.num_samples} samples, "
                f"fewer than one global batch of {self.t.global_batch}"
            )
        # Rank 0 scores each source's first `eval_tokens + 1` held-out tokens.
        self.heldout: list[tuple[str, Tokens]] = []
        if self.rank == 0:
            for s in self.job.sources:
                self.heldout.append((s.name, first_tokens(s.heldout, self.t.eval_tokens + 1)))

    def build_model(self) -> None:
        m = self.model_config
        # `start` initialises or loads the weights.
        self.net = model.build(m, None).to(self.device)
        if self.device.type == "cuda" and model.grouped_mm_available():
            # One grouped product per expert matrix, and no host sync (bit-identical to the
            # loop where both run; `zflow bench experts` times them).
            model.set_expert_path(self.net, "grouped")
        log(f"rank {self.rank}: MoE expert path {self.net.model.layers[0].mlp.expert_path}")
        self.cp = self.context_parallel_group()
        context_parallel.enable(self.net, self.cp)
        activation_checkpointing.apply(self.net, self.job.activation_checkpointing)
        # The loss owns the model: DistributedDataParallel wraps it whole.
        self.lm_loss = CausalLmLoss(self.net, self.t.loss_chunk_tokens)
        self.bound = model.bind(self.net, m)
        self.ids = {t.name: model.param_id(t.name) for t, _ in self.bound}
        self.layout = checkpoint.layout(
            [(t.name, self.ids[t.name], math.prod(t.shape)) for t, _ in self.bound], self.world
        )
        owner = {s["name"]: s["owner"] for s in self.layout["params"]}
        self.owned_by: list[list[nn.Parameter]] = [[] for _ in range(self.world)]
        for t, p in self.bound:
            self.owned_by[owner[t.name]].append(p)
        self.mine = [(t, p) for t, p in self.bound if owner[t.name] == self.rank]
        self.routes = m.num_experts + int(m.mod_skip)
        self.target = balance.target_shares(self.routes, m.mod_skip, self.t.balance)
        self.ddp: nn.Module = self.lm_loss
        if self.world > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            # find_unused_parameters keeps DDP's first bucket layout for good: DDP otherwise
            # rebuilds its buckets after a launch's first step, and where a gradient sits in
            # a bucket decides the order gloo's ring sums the ranks' values in. Past 2 ranks
            # that order changes the rounding, so a relaunch (whose first step has the
            # unrebuilt layout) would not replay the uninterrupted run bit for bit. It also
            # lets an expert that routed no token in a micro-batch go without a gradient.
            self.ddp = nn.parallel.DistributedDataParallel(
                self.lm_loss,
                device_ids=ids,
                broadcast_buffers=False,
                bucket_cap_mb=self.t.grad_bucket_bytes / 2**20,
                find_unused_parameters=True,
                # ZeRO-1 without DDP's extra copy of the gradients: they are views into its
                # buckets, which exist from the backward pass to `zero_grad` only.
                gradient_as_bucket_view=True,
                lazy_bucket_allocation=True,
            )
            if self.t.grad_reduce_dtype == "bf16":
                self.ddp.register_comm_hook(None, reduce.bf16_mean_in_f32)

    def context_parallel_group(self) -> ContextParallel:
        """This rank's context-parallel group: ranks ``[g * C, (g + 1) * C)`` for data-parallel
        index ``g``, neighbours on one node where nodes hold whole groups. Every rank makes
        every group, in the same order, as ``new_group`` requires."""
        if self.cp_size == 1:
            return ContextParallel.single()
        mine = None
        for g in range(self.dp_world):
            group = dist.new_group(list(range(g * self.cp_size, (g + 1) * self.cp_size)))
            if g == self.dp_rank:
                mine = group
        return ContextParallel.over(mine)

    def new_optimizers(self) -> None:
        t = self.t
        matrices = [p for tensor, p in self.mine if tensor.linear]
        rest = [p for tensor, p in self.mine if not tensor.linear]
        aw = t.adamw
        self.muon: torch.optim.Optimizer | None = (
            BatchedMuon(matrices, self.t.muon.ns_dtype, **self.muon_settings())
            if matrices
            else None
        )
        self.adamw = (
            torch.optim.AdamW(
                rest,
                lr=0.0,
                betas=(aw.beta1, aw.beta2),
                eps=aw.eps,
                weight_decay=aw.weight_decay,
            )
            if rest
            else None
        )

    def muon_settings(self) -> dict[str, Any]:
        """torch.optim.Muon's settings for this phase (learning rates come from the schedule)."""
        mu = self.t.muon
        return {
            "lr": 0.0,
            "weight_decay": mu.weight_decay,
            "momentum": mu.momentum,
            "nesterov": mu.nesterov,
            "ns_steps": mu.ns_steps,
            "adjust_lr_fn": "match_rms_adamw",
        }

    def optimizers(self) -> list[tuple[str, torch.optim.Optimizer]]:
        named = [("muon", self.muon), ("adamw", self.adamw)]
        return [(n, o) for n, o in named if o is not None]

    def fresh_state(self, cursor: DataCursor | None = None) -> State:
        """The state at the start of the phase (at ``cursor``, default the mixture's start)."""
        m = self.model_config
        cursor = cursor or self.reader.start(self.job.phase)
        return State(
            {
                "phase": self.job.phase,
                "step": 0,
                "total_steps": self.total_steps,
                "cursor": {
                    "phase": cursor.phase,
                    "sample": cursor.sample,
                    "fingerprint": cursor.fingerprint,
                },
                "balance": [
                    balance.BalanceState.new(self.routes, m.mod_skip).to_json()
                    for _ in range(m.num_blocks)
                ],
                "tokens": 0,
                "seed": self.t.seed,
            }
        )

    def load_weights(self, files: dict[str, bytes], d: Path) -> None:
        if "model.safetensors" not in files:
            raise checkpoint.CheckpointError(f"{d}: no model.safetensors in the checkpoint")
        try:
            model.load_zflow_state(self.net, self.model_config, st_load(files["model.safetensors"]))
        except ValueError as e:
            raise Fatal(f"{d}/model.safetensors: {e}") from e

    def load_optimizers(self, files: dict[str, bytes], d: Path) -> None:
        mine = {self.ids[t.name]: (t, p) for t, p in self.mine}
        momentum = self.t.muon.momentum
        for name, opt in self.optimizers():
            records = checkpoint.read_shard(files, d, name, set(mine))
            for pid, record in records.items():
                t, p = mine[pid]
                try:
                    saved = checkpoint.decode_state(record, t.linear, momentum)
                    checkpoint.check_state(name, saved, list(p.shape))
                except ValueError as e:
                    raise Fatal(f"{d}: the {name} state of `{t.name}`: {e}") from e
                # Copies: the loaded tensors are views of the checkpoint's bytes.
                opt.state[p] = {
                    k: v.clone() if k == "step" else v.to(self.device, copy=True)
                    for k, v in saved.items()
                }

    def start(self) -> State:
        """The state training starts (or restarts after a spike) from: this phase's newest
        checkpoint that verifies, else the previous phase's final one, else a fresh model.

        Resume scales with the ranks: rank 0 alone reads and verifies the checkpoint whole and
        sends the weights to the others; each other rank reads only the optimizer shards that
        hold its own tensors (and the small trainer state and layout)."""
        self.new_optimizers()
        state = self.fresh_state()
        found = self.agreed_checkpoint()
        init = Path(self.job.init) if self.job.init else None
        if found is None and init is None:
            with torch.no_grad():
                model.initialise(self.net, self.model_config, self.t.seed)
            return state
        d: Path
        files: dict[str, bytes] | None
        if found is not None:
            d, files = found
        else:
            assert init is not None
            d, files = init, None
        if files is None and self.rank == 0:
            try:
                files = checkpoint.read_verified(d)
            except checkpoint.CheckpointError as e:
                raise checkpoint.CheckpointError(
                    f"the previous phase's checkpoint {init}: {e}"
                ) from e
        carry = found is not None or self.t.carry_optimizer
        if files is None:
            files = self.my_part(d, carry)
        if self.rank == 0:
            self.load_weights(files, d)
        self.share_weights()
        saved = State(json.loads(files["trainer.json"]))
        if carry:
            self.load_optimizers(files, d)
        if found is not None:
            if saved.phase != self.job.phase:
                raise Fatal(
                    f"{d}: a checkpoint of phase `{saved.phase}` "
                    f"in phase `{self.job.phase}`'s directory"
                )
            log(f"resuming phase {saved.phase} at step {saved.step} from {d}")
            return saved
        # The routing biases are part of the model; the phase's data and step restart.
        state.balance = saved.balance
        carried = "carried" if carry else "reset"
        log(f"phase {state.phase} starts from {init} (optimizer state {carried})")
        return state

    def agreed_checkpoint(self) -> tuple[Path, dict[str, bytes] | None] | None:
        """This phase's newest checkpoint that verifies, as rank 0 finds it (it alone reads
        and hashes its files, quarantining newer ones that fail): rank 0 gets the files, the
        other ranks its path."""
        found = None
        if self.rank == 0:
            found = checkpoint.newest_verified(self.checkpoints, log)
        if self.world == 1:
            return found
        box: list[Any] = [str(found[0]) if found else None]
        dist.broadcast_object_list(box, src=0)
        if box[0] is None:
            return None
        return found if found else (Path(box[0]), None)

    def my_part(self, d: Path, optimizers: bool) -> dict[str, bytes]:
        """What a rank other than 0 reads of checkpoint ``d``: the trainer state and layout,
        and (with ``optimizers``) the shard files that hold its tensors' optimizer state."""
        files = checkpoint.read_files(d, ["trainer.json", "layout.json"])
        if optimizers:
            mine = {self.ids[t.name] for t, _ in self.mine}
            names = [
                name
                for opt, _ in self.optimizers()
                for name in checkpoint.shards_holding(files["layout.json"], opt, mine)
            ]
            files.update(checkpoint.read_files(d, names))
        return files

    def share_weights(self) -> None:
        """Rank 0's weights to every rank, a tensor at a time (no second copy of the model)."""
        if self.world == 1:
            return
        with torch.no_grad():
            for _, p in self.bound:
                dist.broadcast(p.data, src=0)

    # -- one step -------------------------------------------------------------------------------

    def batch(
        self, state: State, garbage: bool, batch_start: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        t, vocab = self.t, self.model_config.vocab_size
        b = self.reader.batch(state.cursor, self.dp_rank, self.dp_world, t.micro_batch)
        tokens = b.tokens
        beyond = tokens[tokens >= vocab]
        if beyond.size:
            raise Fatal(
                f"phase `{self.job.phase}`: the batch at sample {state.cursor.sample} holds "
                f"token id {int(beyond[0])}, beyond model.vocab_size {vocab}"
            )
        if garbage:
            # Fault injection: this batch is noise, as a corrupt shard would be.
            rng = SplitMix64(batch_start ^ 0xBAD)
            tokens = np.array([rng.below(vocab) for _ in range(tokens.size)], dtype=np.int64)
        rows = torch.from_numpy(tokens).view(t.micro_batch, self.seq_len + 1)
        rows = rows.to(self.device)
        # The whole sequences' inputs and targets, then this rank's part of each.
        return self.cp.chunk(rows[:, :-1]), self.cp.chunk(rows[:, 1:])

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def loss(self, module: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The summed next-token loss (``module``: the loss itself, or its DDP wrapper)."""
        with self.autocast():
            total: torch.Tensor = module(inputs, targets)
        return total

    def train_step(
        self, micro: list[tuple[torch.Tensor, torch.Tensor]], lr: float
    ) -> tuple[float, float, list[list[int]]]:
        n = len(micro)
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        counts = torch.zeros(
            (self.model_config.num_blocks, self.routes), dtype=torch.long, device=self.device
        )
        for i, (inputs, targets) in enumerate(micro):
            sync = self.world == 1 or i == n - 1
            ctx = contextlib.nullcontext() if sync else self.ddp.no_sync()  # type: ignore[operator]
            with ctx:
                loss = self.loss(self.ddp, inputs, targets) / targets.numel()
                torch.autograd.backward(loss / n)
            loss_sum += loss.detach().double()
            counts += model.route_counts(self.net)
        mean_loss = loss_sum / n
        if self.world > 1:
            dist.all_reduce(mean_loss)
            mean_loss /= self.world
            dist.all_reduce(counts)
        params = [p for _, p in self.bound]
        clip = self.t.grad_clip
        norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else math.inf)
        for _, opt in self.optimizers():
            for group in opt.param_groups:
                group["lr"] = lr
            opt.step()
        self.net.zero_grad(set_to_none=True)
        if self.world > 1:
            self.gather_parameters()
        return float(mean_loss.item()), float(norm.item()), counts.tolist()

    def gather_parameters(self) -> None:
        """ZeRO-1's all-gather: every rank broadcasts the tensors it owns and updated."""
        with torch.no_grad():
            for owner, params in enumerate(self.owned_by):
                if not params:
                    continue
                flat = torch.cat([p.reshape(-1) for p in params])
                dist.broadcast(flat, src=owner)
                if owner != self.rank:
                    at = 0
                    for p in params:
                        p.copy_(flat[at : at + p.numel()].view_as(p))
                        at += p.numel()

    def evaluate(self) -> list[tuple[str, float]]:
        """Held-out loss per source (rank 0): the first
        ``eval_tokens + 1`` tokens of the held-out documents in windows of ``seq_len``."""
        out = []
        # Rank 0 alone scores whole windows: no context-parallel collectives.
        with torch.no_grad(), context_parallel.whole_sequences(self.net):
            for name, held in self.heldout:
                stream = held.tolist()
                s = self.seq_len
                windows = [stream[i : i + s + 1] for i in range(0, len(stream) - s, s)]
                if not windows:
                    continue
                total, count = 0.0, 0
                for at in range(0, len(windows), self.t.micro_batch):
                    chunk = windows[at : at + self.t.micro_batch]
                    rows = torch.tensor(chunk, dtype=torch.long, device=self.device)
                    total += float(self.loss(self.lm_loss, rows[:, :-1], rows[:, 1:]).item())
                    count += len(chunk) * s
                out.append((name, total / count))
        return out

    # -- checkpoints ----------------------------------------------------------------------------

    def snapshot(self, state: State) -> list[tuple[str, bytes]]:
        """This rank's files of a checkpoint of the current state."""
        by_param = {id(p): (self.ids[t.name], t.linear) for t, p in self.mine}
        optimizers = dict(self.optimizers())
        files = []
        # Every rank writes both files, empty when it owns no tensor of that optimizer.
        for name in checkpoint.OPTIMIZERS:
            opt = optimizers.get(name)
            records = [
                (by_param[id(p)][0], checkpoint.encode_state(s, by_param[id(p)][1]))
                for p, s in (opt.state.items() if opt is not None else [])
                if id(p) in by_param
            ]
            files.append((checkpoint.shard_file(name, self.rank), checkpoint.join_entries(records)))
        if self.rank == 0:
            weights = model.zflow_state(self.net, self.model_config)
            files.append(
                (
                    "model.safetensors",
                    st_save(weights, metadata={"format": checkpoint.WEIGHTS_FORMAT}),
                )
            )
            files.append(("trainer.json", json.dumps(state.to_json(), indent=2).encode()))
            files.append(("layout.json", json.dumps(self.layout, indent=2).encode()))
            files.append(("model.json", json.dumps(encode(self.model_config), indent=2).encode()))
        return files

    def save(self, state: State, saver: checkpoint.Saver, final: bool) -> None:
        files, step = self.snapshot(state), state.step
        fs, rank, world, emit = self.faults, self.rank, self.world, self.emit

        def before_commit(tmp: Path, files: list[tuple[str, bytes]]) -> None:
            if fs.at("kill-in-checkpoint", step):
                # Die with half of the files on disk: the commit must never happen.
                checkpoint.write_files(tmp, files[: len(files) // 2])
                faults.abort(f"killed while writing the step-{step} checkpoint")

        def work() -> None:
            d = checkpoint.commit(self.checkpoints, step, rank, world, files, before_commit)
            if d is not None:
                if fs.at("corrupt-checkpoint", step):
                    path = d / "model.safetensors"
                    data = bytearray(path.read_bytes())
                    data[len(data) // 2] ^= 0x40
                    path.write_bytes(bytes(data))
                    log(f"fault injection: flipped a byte of {path}")
                checkpoint.retain(self.checkpoints, self.t.keep_checkpoints)
                emit.checkpoint_committed(step, str(d))

        saver.save(work, final)

    # -- the phase ------------------------------------------------------------------------------

    def run(self) -> None:
        t = self.t
        if self.rank == 0:
            # Before any rank reads the checkpoints (the others wait for rank 0 in the group).
            checkpoint.remove_unfinished(self.checkpoints)
        self.open_data()
        preflight = bool(os.environ.get(PREFLIGHT))
        if preflight:
            m = self.model_config
            shape = (min(t.micro_batch * self.seq_len, 16384), m.hidden_size, 2 * m.expert_ffn)
            self.emit.preflight(
                self.rank, probe(self.device, self.faults.delay_ms(0), shape), describe(self.device)
            )
        allreduce, links = None, []
        if self.world > 1:
            join_group(self.rank, self.world, self.device)
            if preflight:
                allreduce = allreduce_busbw(self.device)
                per_node = ranks_per_node(self.world)
                links = link_bandwidths(self.device, per_node, self.faults.link_delay_ms())
        self.build_model()
        state = self.start()
        log(f"rank {self.rank} read {checkpoint.bytes_read[0]} bytes of checkpoints")
        params = sum(math.prod(tensor.shape) for tensor, _ in self.bound)
        self.emit.hello(
            self.rank,
            self.world,
            describe(self.device),
            state.step,
            self.total_steps,
            params,
            allreduce,
            links,
        )
        saver = checkpoint.Saver(t.async_checkpoints)
        spike_fired = False
        last_loss = state.loss_history[-1] if state.loss_history else None
        saved_step = state.step if state.step > 0 else None
        gb = t.global_batch
        while state.step < self.total_steps:
            while state.cursor.sample in state.skipped_batches:
                state.cursor = DataCursor(
                    state.cursor.phase, state.cursor.sample + gb, state.cursor.fingerprint
                )
            if state.cursor.sample + gb > self.reader.num_samples:
                log(
                    f"phase {state.phase}: out of samples after skipping batches; "
                    f"ending at step {state.step}"
                )
                break
            started = time.perf_counter()
            batch_start = state.cursor.sample
            garbage = self.faults.at("spike", state.step + 1) and not spike_fired
            spike_fired |= garbage
            model.set_biases(self.net, [b.biases for b in state.balance])
            micro = []
            for _ in range(self.accumulation):
                micro.append(self.batch(state, garbage, batch_start))
                state.cursor = state.cursor.advance(self.dp_world, t.micro_batch)
            lr = schedule.lr(t.schedule, state.step, self.total_steps)
            loss, grad_norm, counts = self.train_step(micro, lr)
            delay = self.faults.delay_ms(state.step + 1)
            if delay:
                time.sleep(delay / 1000)

            # The loss-spike guard; every rank sees the same (all-reduced) loss.
            z = spike.check(t.spike, state.loss_history, loss)
            if z is not None:
                if state.rollbacks < t.spike.max_rollbacks:
                    saver.wait()
                    if self.world > 1:
                        dist.barrier()
                    skipped = sorted(set(state.skipped_batches) | {batch_start})
                    rollbacks, spiked = state.rollbacks + 1, state.step + 1
                    state = self.start()
                    state.skipped_batches, state.rollbacks = skipped, rollbacks
                    log(
                        f"loss spike at step {spiked} (loss {loss:.4f}, z {z:.1f}): "
                        f"back to step {state.step}, skipping samples {batch_start}.."
                    )
                    self.emit.loss_spike(spiked, loss, z, state.step, batch_start)
                    continue
                log(
                    f"loss spike at step {state.step + 1} (z {z:.1f}) but the phase "
                    f"already rolled back {state.rollbacks} times; going on"
                )
            if not math.isfinite(loss):
                raise RuntimeError(
                    f"phase `{state.phase}`: the loss is {loss} at step {state.step + 1}"
                )
            spike.record(t.spike, state.loss_history, loss)

            error = 0.0
            for layer, c in enumerate(counts):
                error += balance.balance_error(c, self.target)
                balance.update(state.balance[layer], c, self.target, t.balance)
            state.step += 1
            tokens = gb * self.seq_len
            state.tokens += tokens
            last_loss = loss
            load = [sum(c[r] for c in counts) for r in range(self.routes)]
            self.emit.step(
                state.step,
                loss,
                lr,
                grad_norm,
                tokens / (time.perf_counter() - started),
                state.tokens,
                load,
                error / len(counts),
            )
            last = state.step == self.total_steps
            if self.rank == 0 and ((t.eval_every > 0 and state.step % t.eval_every == 0) or last):
                self.emit.eval(state.step, self.evaluate())
            if (t.checkpoint_every > 0 and state.step % t.checkpoint_every == 0) or last:
                self.save(state, saver, last)
                saved_step = state.step
            if self.faults.at("crash", state.step):
                faults.abort(f"aborting after step {state.step}")
            if self.faults.at("exit", state.step):
                faults.leave(f"exiting with status 0 after step {state.step}")
            if self.faults.at("hang", state.step):
                faults.hang(f"hanging after step {state.step}")
        if saved_step != state.step:
            # The phase ended early (skipped batches): its last state still becomes a checkpoint.
            self.save(state, saver, True)
        saver.wait()
        self.emit.done(state.step, last_loss)


# -- entry points (zflow_torch.worker) ---------------------------------------------------------


def failure_class(e: BaseException) -> str:
    """What the supervisor should do about ``e`` (runtime/src/contract/exit.rs)."""
    if isinstance(e, Fatal | JobError | model.UnsupportedModel | faults.FaultSpecError):
        return "fatal"
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return "fatal"
    if isinstance(e, PeerLost | dist.DistBackendError | dist.DistNetworkError):
        return "lost_peer"
    if isinstance(e, RuntimeError) and any(words in str(e) for words in PEER_GONE):
        return "lost_peer"
    return "retry"


# gloo raises a peer that left mid-collective as a plain RuntimeError: no type tells it apart
# from any other failure, so its transport's own words do (torch 2.15's gloo; pinned in
# workers/torch/requirements.lock). Without this the rank that noticed was blamed for the
# one that left.
PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def prepare() -> None:
    """Process-wide settings: the stage's thread count, deterministic kernels."""
    threads = os.environ.get("ZFLOW_THREADS")
    if threads:
        torch.set_num_threads(max(int(threads), 1))
    torch.use_deterministic_algorithms(True, warn_only=True)


def probe_only(backend: str, index: int | None, emit: Emitter) -> None:
    """``--probe``: one ``preflight`` message for device ``index`` of ``backend`` (the rank's
    own device when None)."""
    rank = int(os.environ.get(RANK, "0"))
    device = device_for(backend, device_index() if index is None else index)
    emit.preflight(rank, probe(device, faults.Faults.from_env(rank).delay_ms(0)), describe(device))


def train(job_path: str, backend: str, emit: Emitter) -> None:
    """Trains the phase of the job at ``job_path``."""
    try:
        job = read_job(job_path)
    except (OSError, ValueError) as e:
        raise Fatal(f"bad settings: {e}") from e
    try:
        Trainer(job, backend, emit).run()
    finally:
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
