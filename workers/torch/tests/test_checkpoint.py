"""Unit tests of the torch engine's checkpoints and model map (they need torch; the Rust
integration tests run the engine end to end)."""

import dataclasses
import tempfile
import unittest
from pathlib import Path

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from zflow_torch import checkpoint, model
from zflow_torch.job import ModelConfig, decode

# A tiny ZAYA1, as the train job holds its model.
TINY_JSON = {
    "hidden_size": 32,
    "num_blocks": 2,
    "vocab_size": 64,
    "num_query_heads": 2,
    "num_kv_heads": 1,
    "head_dim": 16,
    "conv_kernel": 2,
    "rope_fraction": 0.5,
    "rope_base": 10000.0,
    "num_experts": 3,
    "top_k": 1,
    "expert_ffn": 16,
    "mod_skip": True,
    "skip_output": "zero",
    "sliding_blocks": [],
    "sliding_window": 4096,
    "sliding_rope_base": 10000.0,
    "router_dim": 8,
    "router_mlp_layers": 3,
    "eda": True,
    "residual_scaling": True,
    "tie_embeddings": True,
    "rms_norm_eps": 1e-5,
}
TINY = decode(ModelConfig, TINY_JSON)


class Checkpoints(unittest.TestCase):
    def test_a_commit_verifies_and_a_flipped_byte_is_quarantined(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            root = Path(d)
            checkpoint.commit(root, 5, 0, 1, [("a.bin", b"abc"), ("b.json", b"{}")])
            checkpoint.commit(root, 10, 0, 1, [("a.bin", b"xyz")])
            self.assertEqual(checkpoint.read_verified(root / "step-00000005")["a.bin"], b"abc")
            (root / "step-00000010" / "a.bin").write_bytes(b"xyZ")
            warnings: list[str] = []
            found = checkpoint.newest_verified(root, warnings.append)
            self.assertTrue((root / "quarantine" / "step-00000010").exists())
            assert found is not None
            self.assertEqual(found[0].name, "step-00000005")
            self.assertEqual(found[1]["b.json"], b"{}")
            checkpoint.retain(root, 1)
            self.assertEqual([s for s, _ in checkpoint.listing(root)], [5])

    def test_layout_balances_whole_tensors(self) -> None:
        params = [("e", 1, 1000)] + [(f"x{i}", 10 + i, 300) for i in range(4)] + [("n", 99, 10)]
        layout = checkpoint.layout(params, 2)
        load = [0, 0]
        for slot in layout["params"]:
            load[slot["owner"]] += slot["numel"]
        # As checkpoint::layout::Layout's own test: 1000 + 10 on rank 0, the four 300s on rank 1.
        self.assertEqual(load, [1010, 1200])

    def test_optimizer_records_round_trip_and_foreign_ones_are_recognised(self) -> None:
        state = {
            "step": torch.tensor(3.0),
            "exp_avg": torch.arange(6.0).reshape(2, 3),
            "exp_avg_sq": torch.ones(2, 3),
        }
        record = checkpoint.encode_state(state, linear=False)
        self.assertTrue(record.startswith(checkpoint.RECORD))
        back = checkpoint.decode_state(record, linear=False, momentum=0.95)
        for k, v in state.items():
            self.assertTrue(torch.equal(back[k], v), k)
        checkpoint.check_state("adamw", back, [2, 3])
        with self.assertRaisesRegex(ValueError, "keeps"):
            checkpoint.check_state("muon", back, [2, 3])
        with self.assertRaisesRegex(ValueError, "expected float32"):
            checkpoint.check_state("adamw", back, [3, 2])
        with self.assertRaisesRegex(ValueError, "not an optimizer record"):
            checkpoint.decode_state(b"\x82\xa4burn", False, 0.95)
        joined = checkpoint.join_entries([(9, b"b"), (2, b"aa")])
        self.assertEqual(checkpoint.entries(joined, "x"), [(2, b"aa"), (9, b"b")])

    def test_a_linear_weights_state_is_stored_in_zflows_layout(self) -> None:
        # torch holds a linear weight [out, in]; the record holds [in, out], as
        # model.safetensors does. The round trip is exact.
        buf = torch.arange(6.0).reshape(2, 3)
        record = checkpoint.encode_state({"momentum_buffer": buf}, linear=True)
        stored = st_load(record[len(checkpoint.RECORD) :])["momentum_buffer"]
        self.assertTrue(torch.equal(stored, buf.T))
        back = checkpoint.decode_state(record, linear=True, momentum=0.9)
        self.assertTrue(torch.equal(back["momentum_buffer"], buf))
        self.assertTrue(back["momentum_buffer"].is_contiguous())

    def test_a_native_checkpoints_velocity_reads_as_momentum(self) -> None:
        # Three steps of the retired native engine's v <- mu v + g and torch's Muon buffer
        # (lerp) on one gradient sequence: b = (1 - mu) v.
        mu, grads = (
            0.9,
            [torch.randn(3, 2, generator=torch.Generator().manual_seed(i)) for i in range(3)],
        )
        v, b = torch.zeros(3, 2), torch.zeros(3, 2)
        for g in grads:
            v = mu * v + g
            b.lerp_(g, 1 - mu)
        # The native engine wrote v in zflow's layout ([in, out] = [2, 3] for torch's [3, 2]).
        record = checkpoint.RECORD + st_save({"velocity": v.T.contiguous()})
        back = checkpoint.decode_state(record, linear=True, momentum=mu)
        self.assertEqual(sorted(back), ["momentum_buffer"])
        torch.testing.assert_close(back["momentum_buffer"], b)


class Model(unittest.TestCase):
    def test_weights_map_to_zflow_names_and_back_and_one_seed_is_one_model(self) -> None:
        a = model.build(TINY, seed=7)
        b = model.build(TINY, seed=7)
        state = model.zflow_state(a, TINY)
        self.assertEqual(list(state), [t.name for t in model.zflow_tensors(TINY)])
        for name, value in model.zflow_state(b, TINY).items():
            self.assertTrue(torch.equal(value, state[name]), name)
        c = model.build(TINY, seed=8)
        model.load_zflow_state(c, TINY, state)
        x = torch.randint(0, 64, (2, 9))
        model.set_biases(a, [[0.0, 0.0, 0.0, -1.0]] * 2)
        model.set_biases(c, [[0.0, 0.0, 0.0, -1.0]] * 2)
        self.assertTrue(torch.equal(a(input_ids=x).logits, c(input_ids=x).logits))
        counts = model.route_counts(a)
        self.assertEqual(counts.shape, (2, 4))
        self.assertEqual(int(counts.sum()), 2 * 2 * 9)

    def test_unsupported_configs_are_named(self) -> None:
        with self.assertRaises(model.UnsupportedModel) as caught:
            model.hf_config(dataclasses.replace(TINY, top_k=2))
        self.assertIn("model.top_k", str(caught.exception))
        self.assertIn("top_k = 1 only", str(caught.exception))


if __name__ == "__main__":
    unittest.main()
