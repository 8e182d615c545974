"""The fork server (``zflow_torch/forkserver.py``) against real processes: a client ends as its
forked child ends (exit status, signal), the child gets the client's arguments, environment,
directory and process group, a killed client takes its child along, and the server ends,
removing its folder, when its stdin closes. The server here preloads nothing, so it starts at
once; zflow's preloads torch and transformers."""

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "zflow_torch" / "forkserver.py"

CHILD = """
import json, os, signal, sys, time
what = sys.argv[1]
seen = [sys.argv, os.getcwd(), os.environ.get("WHO"), os.getpgrp(), os.getpid()]
print(json.dumps(seen), flush=True)
if what == "exit":
    sys.exit(3)
if what == "abort":
    os.kill(os.getpid(), signal.SIGABRT)
if what == "wait":
    time.sleep(60)
"""


# A server that preloads nothing, serving at ``sys.argv[1]``, in its environment, giving a
# request 2 s.
SERVE = "import sys; from zflow_torch import forkserver; forkserver.serve(sys.argv[1], (), 2.0)"
SERVE_ENV = {**os.environ, "PYTHONPATH": str(SCRIPT.parent.parent), "PYTHONUNBUFFERED": "1"}


class ForkServer(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="zflow-fork-test-"))
        (self.dir / "child_mod.py").write_text(CHILD)
        self.socket = self.dir / "server" / "socket"
        self.socket.parent.mkdir(mode=0o700)
        self.server = subprocess.Popen(
            [sys.executable, "-c", SERVE, str(self.socket)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=SERVE_ENV,
        )
        assert self.server.stdout is not None
        self.assertEqual(self.server.stdout.readline().strip(), b"ready")

    def tearDown(self) -> None:
        if self.server.poll() is None:
            self.server.kill()
            self.server.wait()
        subprocess.run(["rm", "-rf", str(self.dir)], check=True)

    def client(self, *args: str) -> subprocess.Popen[str]:
        """``python -m child_mod ARGS`` through the server, in a process group of its own."""
        return subprocess.Popen(
            [sys.executable, "-E", "-S", str(SCRIPT), "run", str(self.socket), "--"]
            + ["-m", "child_mod", *args],
            cwd=self.dir,
            env={**os.environ, "WHO": "the client"},
            stdout=subprocess.PIPE,
            text=True,
            process_group=0,
        )

    def test_the_child_is_the_client_and_ends_as_it(self) -> None:
        c = self.client("exit", "x")
        out, _ = c.communicate(timeout=30)
        self.assertEqual(c.returncode, 3, out)
        argv, cwd, who, pgid, pid = json.loads(out)
        self.assertEqual(argv[1:], ["exit", "x"])
        self.assertTrue(argv[0].endswith("child_mod.py"))
        self.assertEqual((cwd, who, pgid), (str(self.dir), "the client", c.pid))
        self.assertNotEqual(pid, c.pid)

        c = self.client("abort")
        c.communicate(timeout=30)
        self.assertEqual(c.returncode, -signal.SIGABRT)
        c = self.client("fine")
        c.communicate(timeout=30)
        self.assertEqual(c.returncode, 0)

    def test_a_group_signal_reaches_the_child_and_a_killed_client_takes_it_along(self) -> None:
        c = self.client("wait")
        assert c.stdout is not None
        child = json.loads(c.stdout.readline())[-1]
        os.killpg(c.pid, signal.SIGTERM)
        self.assertEqual(c.wait(timeout=30), -signal.SIGTERM)

        c = self.client("wait")
        assert c.stdout is not None
        child = json.loads(c.stdout.readline())[-1]
        c.kill()
        c.wait()
        deadline = time.monotonic() + 10
        while Path(f"/proc/{child}").exists():
            self.assertLess(time.monotonic(), deadline, "the child outlived its client")
            time.sleep(0.05)

    def test_the_server_ends_with_its_stdin_and_removes_its_folder(self) -> None:
        c = self.client("wait")
        assert c.stdout is not None and self.server.stdin is not None
        child = json.loads(c.stdout.readline())[-1]
        self.server.stdin.close()
        self.assertEqual(self.server.wait(timeout=30), 0)
        self.assertFalse(self.socket.parent.exists())
        self.assertFalse(Path(f"/proc/{child}").exists())
        c.wait(timeout=30)
        # With no server, a client starts the process plainly.
        c = self.client("exit")
        c.communicate(timeout=30)
        self.assertEqual(c.returncode, 3)

    def test_a_folder_others_may_enter_is_refused_by_clients_and_servers(self) -> None:
        # Another user who may write the folder could replace the socket and be sent each
        # rank's arguments, environment (its launch secret) and stdio.
        os.chmod(self.socket.parent, 0o777)
        c = self.client("exit")
        out, _ = c.communicate(timeout=30)
        self.assertEqual(c.returncode, 3)
        # Started plainly (exec'd in place), not forked by the server.
        self.assertEqual(json.loads(out.splitlines()[0])[-1], c.pid)
        open_folder = self.dir / "open"
        open_folder.mkdir()
        os.chmod(open_folder, 0o777)
        server = subprocess.run(
            [sys.executable, "-c", SERVE, str(open_folder / "socket")],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=SERVE_ENV,
            timeout=60,
        )
        self.assertNotEqual(server.returncode, 0)
        self.assertIn("with mode 0777", server.stderr)
        self.assertEqual(server.stdout, "")
        self.assertFalse((open_folder / "socket").exists())

    def send(self, message: bytes, fds: tuple[int, ...] = (0, 1, 2)) -> socket.socket:
        """A connection to the server that has sent ``message`` with ``fds``."""
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(str(self.socket))
        if message:
            socket.send_fds(conn, [message], list(fds))
        return conn

    def test_bad_requests_are_refused_and_a_silent_one_holds_up_no_other(self) -> None:
        # One that never speaks, connected first: the others are served meanwhile, and it is
        # refused at its deadline.
        silent = self.send(b"")
        deep = b"[" * 200_000 + b"]" * 200_000
        for message, why in [
            (struct.pack(">I", len(deep)) + deep, "nested deeper"),
            (struct.pack(">I", 0xFFFF_FFF0), "at most"),
            (struct.pack(">I", 2) + b"{}", "a request must be"),
            (struct.pack(">I", 3) + b"{x}", "not JSON"),
        ]:
            with self.send(message) as conn:
                answer = conn.makefile("r").readline()
            self.assertTrue(answer.startswith("error ") and why in answer, answer)
        c = self.client("exit")
        c.communicate(timeout=30)
        self.assertEqual(c.returncode, 3)
        silent.settimeout(30)
        self.assertIn(b"not complete within", silent.recv(4096))
        silent.close()
        self.assertIsNone(self.server.poll(), "the server ended")


if __name__ == "__main__":
    unittest.main()
