"""A fork server: torch and transformers imported once, each process forked from it.

Importing this package's trainer costs 5-6 s of CPU per process (torch, and transformers,
which imports torch's compiler and distributed tensors), far more than a CPU rank of a small
model spends training. On one machine on the CPU, zflow (``stages/src/forkserver.rs``) starts
one server per ``zflow`` process and runs each rank or scorer as a client of it:

- ``python -m zflow_torch.forkserver serve SOCKET``: imports :data:`PRELOAD` and runs no torch
  operation (so no OpenMP thread exists to be lost across a fork; numpy's OpenBLAS thread
  stops before each fork and starts again in the child by its own ``pthread_atfork``
  handlers), listens on the Unix socket ``SOCKET`` (its folder is zflow's, mode 0700 and this
  user's, which the server checks before it binds and each client before it connects:
  :func:`check_private`; a peer of another user is refused), and prints ``ready``. It ends,
  killing what it forked, when its stdin closes: when zflow ends, however it ends.
- ``python -E -S forkserver.py run SOCKET -- -m MODULE ARGS...``: what zflow starts in place of
  ``python -m MODULE ARGS...``. It sends the server its arguments, environment, working
  directory and process group, and its stdin, stdout and stderr (``SCM_RIGHTS``). The server
  forks a child that takes all of them, joins the client's process group (so zflow's group
  signals reach it), and runs ``MODULE`` as ``__main__``. The client waits for the child's
  end and ends the same way: the same exit status, or the same signal.

If the client is killed, the server kills its child; if the server dies, its children die
(``PR_SET_PDEATHSIG``). The messages, client to server: a 4-byte big-endian length and a JSON
object ``{"argv", "env", "cwd", "pgid"}`` carrying three file descriptors. Server to client,
one line each: ``pid N``, then ``exit STATUS`` (the raw ``waitpid`` status), or ``error TEXT``.

The server reads every request as its bytes come, all at once, so no client holds up another:
a request is refused (``error``, the connection closed, its descriptors too) when it is longer
than :data:`MAX_REQUEST_BYTES`, nested deeper than Python's recursion limit, not of the shape
above, or not complete within :data:`REQUEST_DEADLINE_S` of its connection.
"""

from __future__ import annotations

import ctypes
import json
import os
import selectors
import signal
import socket
import stat
import struct
import sys
import time
import traceback
from typing import Any

#: What the server imports before it forks: what the worker and the scorer import, but not
#: those modules themselves (each runs as ``__main__``, and a copy already imported under its
#: own name would make two of every class in it).
PRELOAD = (
    "zflow_torch.trainer",
    "zflow_torch.contract",
    "zflow_torch.faults",
    "transformers.models.zaya.modeling_zaya",
    "tokenizers",
)

_PR_SET_PDEATHSIG = 1


#: The longest request read (its JSON), far above a rank's arguments and environment.
MAX_REQUEST_BYTES = 8 << 20

#: Seconds a client has to send its whole request after it connects.
REQUEST_DEADLINE_S = 10.0


class _Pending:
    """A request being read: its bytes and descriptors so far, and when it must be complete."""

    def __init__(self, deadline: float) -> None:
        self.data = bytearray()
        self.fds: list[int] = []
        self.deadline = deadline

    def close_fds(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def _read_request(conn: socket.socket, pending: _Pending) -> dict[str, Any] | None:
    """Reads what ``conn`` has (it does not block) into ``pending``: the request once it is
    whole, else ``None``. Raises ``ValueError`` for a request that cannot become one."""
    data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 3)
    pending.fds += fds
    if not data:
        raise ValueError("the client hung up before its request was complete")
    pending.data += data
    if len(pending.data) < 4:
        return None
    (length,) = struct.unpack(">I", pending.data[:4])
    if length > MAX_REQUEST_BYTES:
        raise ValueError(f"a request of {length} bytes; at most {MAX_REQUEST_BYTES} are read")
    if len(pending.data) < 4 + length:
        return None
    if len(pending.data) > 4 + length:
        raise ValueError("bytes after the request")
    if len(pending.fds) != 3:
        raise ValueError(f"expected 3 file descriptors, got {len(pending.fds)}")
    return _parse_request(bytes(pending.data[4:]))


def _parse_request(body: bytes) -> dict[str, Any]:
    """The request in ``body``, checked for its shape; ``ValueError`` names what is wrong."""
    try:
        request = json.loads(body)
    except RecursionError:
        raise ValueError("a request nested deeper than the recursion limit") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"a request that is not JSON: {e}") from None
    shape = (
        isinstance(request, dict)
        and isinstance(request.get("argv"), list)
        and all(isinstance(a, str) for a in request["argv"])
        and isinstance(request.get("env"), dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in request["env"].items())
        and isinstance(request.get("cwd"), str)
        and isinstance(request.get("pgid"), int)
    )
    if not shape:
        raise ValueError(
            'a request must be {"argv": [str], "env": {str: str}, "cwd": str, "pgid": int}'
        )
    checked: dict[str, Any] = request
    return checked


def _child(request: dict[str, Any], fds: list[int], parent: int, server_fds: list[int]) -> None:
    """In the forked child: become the client's process (its descriptors ``fds`` as stdio, the
    server's own ``server_fds`` closed) and run its module. Never returns."""
    code = 1
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)
        for fd in server_fds:
            os.close(fd)
        os.setpgid(0, request["pgid"])
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        argv = request["argv"]
        if len(argv) < 2 or argv[0] != "-m":
            raise ValueError(f"the fork server runs `-m MODULE ARGS...`, not {argv!r}")
        import runpy

        # As `python -m`: the working directory first on the path, the module's file as argv[0].
        sys.path[0] = os.getcwd()
        sys.argv = [argv[1], *argv[2:]]
        try:
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:
                print(e.code, file=sys.stderr)
                code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def check_private(path: str) -> None:
    """Raises ``PermissionError`` unless the folder of socket ``path`` is a folder (not a
    link) of this user's that no one else may enter or write: another user who could would
    replace the socket, and receive the arguments, environment (the launch secret among them)
    and stdio of every rank that connects."""
    folder = os.path.dirname(path)
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(
            f"the fork server's folder {folder} must be a folder of uid {os.getuid()} with mode "
            f"0700; it is {'a folder' if stat.S_ISDIR(st.st_mode) else 'not a folder'} of uid "
            f"{st.st_uid} with mode {stat.S_IMODE(st.st_mode):04o}"
        )


def serve(
    path: str, preload: tuple[str, ...] = PRELOAD, deadline_s: float = REQUEST_DEADLINE_S
) -> None:
    """Imports ``preload``, then forks a child per request until stdin closes; a request must
    be complete ``deadline_s`` after its connection."""
    import importlib

    check_private(path)
    for module in preload:
        importlib.import_module(module)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    try:
        _serve(listener, deadline_s)
    finally:
        # The socket's folder is this server's alone (zflow made it for it).
        os.unlink(path)
        os.rmdir(os.path.dirname(path))


def _serve(listener: socket.socket, deadline_s: float) -> None:
    """Accepts requests on ``listener`` and forks for each until stdin closes."""
    listener.listen(64)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(sys.stdin, selectors.EVENT_READ, "stdin")
    # Connections whose request is being read; connection -> (child pid, its pidfd); pidfd ->
    # connection.
    pending: dict[socket.socket, _Pending] = {}
    children: dict[socket.socket, tuple[int, int]] = {}
    by_pidfd: dict[int, socket.socket] = {}
    print("ready", flush=True)

    def end(conn: socket.socket, status: int | None) -> None:
        pid, pidfd = children.pop(conn)
        by_pidfd.pop(pidfd)
        selector.unregister(conn)
        selector.unregister(pidfd)
        if status is None:  # the client is gone: so goes its child
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        else:
            try:
                conn.sendall(f"exit {status}\n".encode())
            except OSError:
                pass
        os.close(pidfd)
        conn.close()

    def refuse(conn: socket.socket, why: str) -> None:
        pending.pop(conn).close_fds()
        selector.unregister(conn)
        try:
            conn.sendall(f"error {why}\n".encode())
        except OSError:
            pass
        conn.close()

    def fork(conn: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
        server_fds = [
            listener.fileno(),
            selector.fileno(),
            conn.fileno(),
            *(c.fileno() for c in pending),
            *(c.fileno() for c in children),
            *by_pidfd,
        ]
        server = os.getpid()
        pid = os.fork()
        if pid == 0:
            _child(request, fds, server, server_fds)
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        children[conn] = (pid, pidfd)
        by_pidfd[pidfd] = conn
        selector.register(conn, selectors.EVENT_READ, "client")
        selector.register(pidfd, selectors.EVENT_READ, "child")
        try:
            conn.sendall(f"pid {pid}\n".encode())
        except OSError:
            end(conn, None)

    while True:
        now = time.monotonic()
        for conn in [c for c, p in pending.items() if p.deadline <= now]:
            refuse(conn, f"the request was not complete within {deadline_s:g} s")
        wait = min((p.deadline for p in pending.values()), default=None)
        for key, _ in selector.select(None if wait is None else max(wait - now, 0.0)):
            what = key.data
            if what == "stdin":
                if not os.read(sys.stdin.fileno(), 4096):
                    for conn in list(pending):
                        refuse(conn, "the server is ending")
                    for conn in list(children):
                        end(conn, None)
                    return
            elif what == "accept":
                conn, _ = listener.accept()
                creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
                _pid, uid, _gid = struct.unpack("3i", creds)
                if uid != os.getuid():
                    conn.close()
                    continue
                conn.setblocking(False)
                pending[conn] = _Pending(time.monotonic() + deadline_s)
                selector.register(conn, selectors.EVENT_READ, "request")
            elif what == "request":
                reader = key.fileobj
                assert isinstance(reader, socket.socket)
                conn = reader
                try:
                    request = _read_request(conn, pending[conn])
                except BlockingIOError:
                    continue
                except (ValueError, OSError) as e:
                    refuse(conn, str(e))
                    continue
                if request is not None:
                    fds = pending.pop(conn).fds
                    selector.unregister(conn)
                    fork(conn, request, fds)
            elif what == "client":
                # A client only ever speaks first; anything readable now is its end. (Its
                # child may have ended in the same batch of events, and been handled.)
                client = key.fileobj
                if isinstance(client, socket.socket) and client in children:
                    end(client, None)
            elif key.fd in by_pidfd:
                conn = by_pidfd[key.fd]
                pid, _ = children[conn]
                # Not blocking: a stale event's descriptor number may be a new child's now.
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    end(conn, status)


def run(path: str, argv: list[str]) -> None:
    """The client: has the server at ``path`` run ``argv`` as this process; ends as it ends."""
    # zflow signals the whole process group, which the child joins: the child takes SIGTERM
    # (or not) itself, and this process waits for what it does. SIGKILL still ends this
    # process, and the server then kills the child.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        check_private(path)
        conn.connect(path)
    except OSError as e:
        # No server (it ended, or zflow's check raced its end): be the process itself.
        print(f"zflow fork server: {e}; starting plainly", file=sys.stderr, flush=True)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.execv(sys.executable, [sys.executable, *argv])
    request = {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "pgid": os.getpgrp()}
    body = json.dumps(request).encode()
    message = struct.pack(">I", len(body)) + body
    sent = socket.send_fds(conn, [message], [0, 1, 2])
    if sent < len(message):
        conn.sendall(message[sent:])
    for line in conn.makefile("r"):
        word, _, rest = line.strip().partition(" ")
        if word == "exit":
            status = int(rest)
            if os.WIFSIGNALED(status):
                sig = os.WTERMSIG(status)
                if sig not in (signal.SIGKILL, signal.SIGSTOP):
                    signal.signal(sig, signal.SIG_DFL)
                os.kill(os.getpid(), sig)
            os._exit(os.waitstatus_to_exitcode(status))
        if word == "error":
            sys.exit(f"zflow fork server: {rest}")
    sys.exit("zflow fork server: it ended before its child did")


def main() -> None:
    args = sys.argv[1:]
    if len(args) == 2 and args[0] == "serve":
        serve(args[1])
    elif len(args) >= 3 and args[0] == "run" and args[2] == "--":
        run(args[1], args[3:])
    else:
        sys.exit("usage: forkserver.py serve SOCKET | run SOCKET -- -m MODULE ARGS...")


if __name__ == "__main__":
    main()
