"""The scorer (``zflow_torch.score``). Log-likelihoods: its two ways of running a message, each
group's shared prefix once through transformers' cache or every request in one padded batch,
give the same log-likelihoods and argmax verdicts, and only the scored positions are read.
Generation: every context in one left-padded batch gives each the tokens it gets alone, each
row ending at its stop string or end token, and the batch ending when its last row does.
Folders: a sharded one loads, and weights that are not the config's model are refused by name."""

import json
import string
import tempfile
import unittest
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from test_checkpoint import TINY
from tokenizers import Tokenizer, decoders, models
from transformers import LlamaConfig, LlamaForCausalLM, ZayaForCausalLM

from zflow_torch import model, score


class Scoring(unittest.TestCase):
    def test_a_shared_prefix_scores_as_the_whole_rows_do(self) -> None:
        config = model.hf_config(TINY)
        torch.manual_seed(0)
        net = ZayaForCausalLM(config).eval()
        gen = torch.Generator().manual_seed(1)
        vocab = TINY.vocab_size

        def ids(n: int) -> list[int]:
            drawn: list[int] = torch.randint(0, vocab, (n,), generator=gen).tolist()
            return drawn

        question = ids(12)
        groups = [
            [{"context": question, "continuation": ids(n)} for n in (1, 3, 5, 2)],
            [{"context": ids(4), "continuation": ids(2)}],
            # The continuation's first token is the context's last: the prefix stops short.
            [{"context": [7, 8], "continuation": [9]}, {"context": [7, 8], "continuation": [9, 9]}],
        ]
        with torch.inference_mode():
            shared = [score.score(net, g, share_prefix=True) for g in groups]
            whole = [score.score(net, g, share_prefix=False) for g in groups]
        for g_shared, g_whole in zip(shared, whole, strict=True):
            for (a, greedy_a), (b, greedy_b) in zip(g_shared, g_whole, strict=True):
                self.assertLess(abs(a - b), 1e-5 * max(abs(b), 1.0), (a, b))
                self.assertEqual(greedy_a, greedy_b)
        # A tiny model scores a message as one batch, in the groups' shape.
        self.assertEqual([len(g) for g in score.loglikelihood(net, [*groups, []])], [4, 1, 2, 0])
        self.assertEqual(score.shared_prefix([[1, 2, 3], [1, 2, 4], [1, 2]]), 1)


def varied_net() -> ZayaForCausalLM:
    """The tiny model with its matrices drawn three times as wide as usual: from zflow's small
    initial weights an untrained model repeats one token, which would not show a row taking
    another's tokens or a step out of place."""
    torch.manual_seed(0)
    net = ZayaForCausalLM(model.hf_config(TINY)).eval()
    with torch.no_grad():
        for p in net.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 3.0 / p.shape[-1] ** 0.5)
    return net


def tiny_tokenizer() -> Tokenizer:
    """A ``tokenizer.json`` for the tiny vocabulary, read back as the scorer reads its third
    argument: token ``i`` is two letters (``aa``, ``ab``, ...), decoded by concatenation, so a
    stop string can straddle tokens."""
    letters = string.ascii_lowercase
    words = {letters[i // 26] + letters[i % 26]: i for i in range(TINY.vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="aa"))
    tokenizer.decoder = decoders.Fuse()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tokenizer.json"
        tokenizer.save(str(path))
        return Tokenizer.from_file(str(path))


def cut(tokens: list[int], tokenizer: Tokenizer, until: list[str], eos: list[int]) -> list[int]:
    """``tokens`` up to the first at which the whole of them so far, decoded, contain a stop
    string (empty ones are none), or the first end token: the stop rule by its definition,
    without the scorer's decoding window."""
    for n, t in enumerate(tokens, 1):
        text = tokenizer.decode(tokens[:n], skip_special_tokens=False)
        if t in eos or any(u and u in text for u in until):
            return tokens[:n]
    return tokens


class Generation(unittest.TestCase):
    NEW = 16
    net: ZayaForCausalLM
    tokenizer: Tokenizer
    contexts: list[list[int]]
    alone: list[list[int]]

    @classmethod
    def setUpClass(cls) -> None:
        cls.net = varied_net()
        cls.tokenizer = tiny_tokenizer()
        gen = torch.Generator().manual_seed(1)
        cls.contexts = [
            torch.randint(0, TINY.vocab_size, (n,), generator=gen).tolist() for n in (3, 11, 17)
        ]
        # Each context alone, greedy, the whole sequence run again for every token (no cache,
        # no padding): the reference for the cached, batched loop.
        cls.alone = []
        with torch.inference_mode():
            for c in cls.contexts:
                row = list(c)
                for _ in range(cls.NEW):
                    logits = cls.net(input_ids=torch.tensor([row])).logits
                    row.append(int(logits[0, -1].argmax()))
                cls.alone.append(row[len(c) :])

    def counted(
        self, max_new_tokens: int, until: list[str], eos: list[int]
    ) -> tuple[list[list[int]], int]:
        """The batch's generations and how many forward passes made them."""
        calls = []
        hook = self.net.register_forward_pre_hook(lambda *_: calls.append(1))
        try:
            out = score.generate(
                self.net, self.tokenizer, self.contexts, max_new_tokens, until, eos
            )
        finally:
            hook.remove()
        return out, len(calls)

    def test_a_batch_generates_what_each_context_does_alone(self) -> None:
        # Not one token repeated: a row's own tokens are told from another's.
        self.assertGreater(len({t for a in self.alone for t in a}), 8, self.alone)
        for n in (1, 4, self.NEW):
            out, calls = self.counted(n, [], [])
            self.assertEqual(out, [a[:n] for a in self.alone], n)
            self.assertEqual(calls, n)
        self.assertEqual(score.generate(self.net, None, self.contexts, 0, [], []), [[], [], []])

    def test_a_row_stops_at_its_stop_string_and_the_others_go_on(self) -> None:
        # Three letters of the middle row's 6th and 7th tokens, and of the last row's 14th and
        # 15th: stop strings that straddle two tokens and really occur, the second further in
        # than the stop check's window reaches back.
        stop = self.tokenizer.decode(self.alone[1])[11:14]
        late = self.tokenizer.decode(self.alone[2])[27:30]
        until = [stop, "", late, "zz"]
        expected = [cut(a, self.tokenizer, until, []) for a in self.alone]
        self.assertEqual([len(e) for e in expected], [self.NEW, 7, 15], (until, expected))
        self.assertGreater(15, score.stop_window(until))
        msg = {
            "op": "generate",
            "contexts": self.contexts,
            "max_new_tokens": self.NEW,
            "until": until,
            "eos": [],
        }
        reply = score.answer(self.net, self.tokenizer, json.loads(json.dumps(msg)))
        self.assertEqual(json.loads(json.dumps(reply)), {"generations": expected})
        self.assertIn(stop, self.tokenizer.decode(reply["generations"][1]))
        with self.assertRaises(ValueError):
            score.generate(self.net, None, self.contexts, self.NEW, until, [])

    def test_the_batch_ends_when_its_last_row_stops(self) -> None:
        # The first row ends at an end token, the others at stop strings.
        eos = [self.alone[0][2]]
        until = [self.tokenizer.decode(a[4:6]) for a in self.alone[1:]]
        expected = [cut(a, self.tokenizer, until, eos) for a in self.alone]
        longest = max(len(e) for e in expected)
        self.assertLess(longest, self.NEW, expected)
        out, calls = self.counted(self.NEW, until, eos)
        self.assertEqual(out, expected)
        self.assertEqual(calls, longest)
        self.assertEqual(out[0][-1], eos[0])

    def test_the_stop_check_decodes_enough_of_a_row(self) -> None:
        self.assertEqual(score.stop_window(["ab", "\n\nQuestion:", "é"]), 11 + 8)


if __name__ == "__main__":
    unittest.main()


def tiny_llama(folder: Path, max_shard_size: str = "5GB") -> None:
    """A tiny Llama (a model family other than ZAYA1) saved in ``folder`` as transformers
    saves it: its output head tied to the embedding, so the file holds the head once."""
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder, max_shard_size=max_shard_size)


def edit_config(folder: Path, **fields: int) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(fields)
    path.write_text(json.dumps(config))


class Folders(unittest.TestCase):
    """A Hugging Face folder is loaded when its weights are the model its config describes,
    sharded or not, and refused with the names of what differs otherwise."""

    def refusal(self, folder: Path) -> str:
        with self.assertRaises(score.FolderError) as caught:
            score.load(folder, "cpu")
        return str(caught.exception)

    def test_a_sharded_folder_loads_as_its_single_file(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            single, sharded = Path(d, "single"), Path(d, "sharded")
            tiny_llama(single)
            tiny_llama(sharded, max_shard_size="4KB")
            self.assertTrue((sharded / "model.safetensors.index.json").exists())
            ids = torch.tensor([[1, 2, 3, 4]])
            with torch.inference_mode():
                a = score.load(single, "cpu")(ids).logits
                b = score.load(sharded, "cpu")(ids).logits
            self.assertTrue(torch.equal(a, b))

    def test_a_missing_or_unexpected_tensor_is_refused_by_name(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            folder = Path(d)
            tiny_llama(folder)
            weights = folder / "model.safetensors"
            tensors = load_file(weights)
            gone = "model.layers.1.mlp.down_proj.weight"
            save_file({k: v for k, v in tensors.items() if k != gone}, weights)
            self.assertIn(f"the files lack `{gone}`", self.refusal(folder))
            save_file({**tensors, "model.layers.1.extra": torch.zeros(3)}, weights)
            self.assertIn(
                "unexpected (not in the model): `model.layers.1.extra`", self.refusal(folder)
            )

    def test_a_config_larger_than_its_weights_is_refused_before_allocating(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            folder = Path(d)
            tiny_llama(folder)
            # One layer too many: transformers alone would fill it with random values.
            edit_config(folder, num_hidden_layers=3)
            error = self.refusal(folder)
            self.assertIn("config.json describes a model of", error)
            self.assertIn("`model.layers.2.", error)
            # 2^20 wide: about 10^12 values, refused from the meta model, nothing allocated.
            edit_config(folder, num_hidden_layers=2, hidden_size=1 << 20, head_dim=8)
            self.assertIn("describes a model of", self.refusal(folder))

    def test_a_tensor_of_another_shape_is_refused_by_name(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            folder = Path(d)
            tiny_llama(folder)
            edit_config(folder, intermediate_size=16)
            self.assertIn(
                "`model.layers.0.mlp.down_proj.weight` is [16, 32], the model's is [16, 16]",
                self.refusal(folder),
            )
