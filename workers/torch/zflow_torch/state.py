"""The trainer's state between steps, as a checkpoint's ``trainer.json`` holds it
(``runtime/src/checkpoint/mod.rs``' ``TrainerState`` is its page)."""

from typing import Any

from zflow_torch import balance
from zflow_torch.mixture import DataCursor


class State:
    """``trainer.json``: step, data cursor, balancing state, tokens, loss history, skips."""

    def __init__(self, d: dict[str, Any]) -> None:
        self.phase: str = d["phase"]
        self.step: int = d["step"]
        self.total_steps: int = d["total_steps"]
        c = d["cursor"]
        self.cursor = DataCursor(c["phase"], c["sample"], c["fingerprint"])
        self.balance = [
            balance.BalanceState(
                [balance.f32(b) for b in s["biases"]],
                list(s["integral"]),
                list(s["last_error"]),
                list(s["m"]),
                list(s["v"]),
                s["steps"],
            )
            for s in d["balance"]
        ]
        self.tokens: int = d["tokens"]
        self.seed: int = d["seed"]
        self.loss_history: list[float] = list(d.get("loss_history", []))
        self.skipped_batches: list[int] = list(d.get("skipped_batches", []))
        self.rollbacks: int = d.get("rollbacks", 0)

    def to_json(self) -> dict[str, Any]:
        c = self.cursor
        return {
            "phase": self.phase,
            "step": self.step,
            "total_steps": self.total_steps,
            "cursor": {"phase": c.phase, "sample": c.sample, "fingerprint": c.fingerprint},
            "balance": [b.to_json() for b in self.balance],
            "tokens": self.tokens,
            "seed": self.seed,
            "loss_history": self.loss_history,
            "skipped_batches": self.skipped_batches,
            "rollbacks": self.rollbacks,
        }
