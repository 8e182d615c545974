"""The scorer's two ways of running a message (``zflow_torch.score``): each group's shared
prefix once through transformers' cache, or every request in one padded batch. They give the
same log-likelihoods and argmax verdicts, and only the scored positions are read."""

import unittest

import torch
from test_checkpoint import TINY
from transformers import ZayaForCausalLM

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


if __name__ == "__main__":
    unittest.main()
