"""A world of gloo ranks on loopback for the unit tests: each rank a process forked from the
test (torch and transformers already imported and warm; spawned ones would take seconds each),
a failed or hung rank failing the test instead of leaving it waiting."""

import multiprocessing
import os
import socket
import time
import unittest
from collections.abc import Callable
from datetime import timedelta

import torch.distributed as dist

RankMain = Callable[[int, int, str], None]
"""What one rank runs: ``main(rank, port, out)``, ``out`` a folder for its results."""


def join(rank: int, port: int, world: int) -> None:
    """Joins the default process group of ``world`` gloo ranks whose store is at ``port``."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )


def run(test: unittest.TestCase, main: RankMain, world: int, out: str, deadline: float) -> None:
    """Runs ``main`` on ``world`` forked ranks and waits for all of them; fails ``test`` when a
    rank exits with an error (its traceback on stderr) or when ``time.monotonic()`` passes
    ``deadline`` (a hung rank: a lost peer)."""
    port = free_port()
    fork = multiprocessing.get_context("fork")
    ranks = [fork.Process(target=main, args=(r, port, out)) for r in range(world)]
    for p in ranks:
        p.start()
    try:
        while any(p.is_alive() for p in ranks):
            failed = [r for r, p in enumerate(ranks) if p.exitcode not in (None, 0)]
            if failed:
                test.fail(f"rank {failed[0]} exited with {ranks[failed[0]].exitcode}")
            if time.monotonic() > deadline:
                test.fail("the ranks did not finish in time")
            time.sleep(0.02)
    finally:
        for p in ranks:
            p.kill()
            p.join()
    test.assertEqual([p.exitcode for p in ranks], [0] * world)


def free_port() -> int:
    """A loopback port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
