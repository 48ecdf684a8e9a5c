"""The test workers' fork server: real server and cluster processes without paying their imports each time.

A live test starts ~60 ASGI servers and ~30 task clusters per suite; about 0.6 s of the ~1 s of CPU each
start costs is importing the same third-party modules (twisted, autobahn, daphne, Django, pydantic,
channels, the database and Redis clients). `python -m tests.forkserver` imports those once, then for each
request forks a child that becomes the requested program: a new session, the test's environment, working
folder and log file as stdin/stdout/stderr, then `-m daphne ...` or `manage.py ...` run as `python` would
run them. What it preloads is only imported, never set up: no Django settings, no event loop, no reactor
(twisted's is installed by daphne in the child), no thread; `_preload` checks that. Every other module,
the project's own included, is imported in the child as in a fresh process.

`spawn` (used by tests.conftest.Proc) returns a `ForkedPopen`: the `subprocess.Popen` surface the tests
use (pid, poll, wait, send_signal, terminate, kill, returncode). The child is the fork server's, not
the worker's: its end is seen through a pidfd and its exit status read by asking the fork server to reap
it (it reaps nothing unasked, so a pid is never reused under a waiting test). One fork server per test
worker, started at its first request; it ends when the worker closes its pipe. MAIBOT_TEST_FORKSERVER=0
turns it off (every process a plain `subprocess.Popen`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

# Imported once in the fork server. Nothing here may read the environment of one test, start a thread,
# create an event loop or install twisted's reactor at import time.
PRELOAD = (
    "asyncio",
    "sqlite3",
    "twisted.internet.asyncioreactor",
    "twisted.internet.tcp",
    "twisted.internet.endpoints",
    "autobahn.twisted.websocket",
    "daphne.ws_protocol",
    "daphne.http_protocol",
    "daphne.endpoints",
    "daphne.access",
    "django.db.models",
    "django.http",
    "django.core.handlers.asgi",
    "django.core.management",
    "django.forms",
    "django.template",
    "pydantic",
    "channels.routing",
    "channels.generic.websocket",
    "tomlkit",
    "dateutil.parser",
    "croniter",
    "redis",
    "psycopg",
    "watchfiles",
    "socketio",
)


# --- the fork server ------------------------------------------------------------------------------------


def _preload() -> None:
    import gc
    import importlib
    import threading

    for name in PRELOAD:
        importlib.import_module(name)
    assert "twisted.internet.reactor" not in sys.modules, "a preloaded module installed twisted's reactor"
    assert threading.active_count() == 1, "a preloaded module started a thread"
    # What the preload made stays out of the collector's sight: a child's collections then do not touch
    # (and so copy) the fork server's pages.
    gc.collect()
    gc.freeze()


def _serve() -> dict | None:
    """Answer requests on stdin until it closes (None), or return, in a forked child, its request."""
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "spawn":
            pid = os.fork()
            if pid == 0:
                return request
            answer = {"pid": pid}
        else:  # reap: the child has ended (the client saw its pidfd), so this does not block for long
            _, status = os.waitpid(request["pid"], 0)
            answer = {"returncode": os.waitstatus_to_exitcode(status)}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    _reap_all(5)
    return None


def _reap_all(seconds: int) -> None:
    """At the end, reap the children the worker killed without asking (their CPU time counts for the
    worker's, as a plain child's would); one still running after `seconds` is left to init."""
    import signal

    signal.signal(signal.SIGALRM, lambda *_: sys.exit(0))
    signal.alarm(seconds)
    with contextlib.suppress(ChildProcessError):
        while True:
            os.waitpid(-1, 0)


def _become(request: dict) -> None:
    """In the forked child: become `request["argv"]` as a fresh `python` would run it."""
    import faulthandler
    import io
    import runpy

    os.setsid()
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    encoding = sys.stdout.encoding
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding=encoding)
    for fd, name, errors in ((1, "stdout", "strict"), (2, "stderr", "backslashreplace")):
        raw = io.FileIO(fd, "w", closefd=False)
        binary = raw if unbuffered else io.BufferedWriter(raw)
        text = io.TextIOWrapper(binary, encoding=encoding, errors=errors, write_through=unbuffered or fd == 2)
        setattr(sys, name, text)
    if os.environ.get("PYTHONFAULTHANDLER"):
        faulthandler.enable(file=sys.stderr, all_threads=True)
    argv = request["argv"][1:]
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        script = os.path.abspath(argv[0])
        sys.argv = argv
        sys.path[0] = os.path.dirname(script)
        runpy.run_path(script, run_name="__main__")


# --- the client, in the test worker ---------------------------------------------------------------------

_server = None


def usable(args: list[str]) -> bool:
    """Whether the fork server can run `args`: this interpreter running daphne or manage.py."""
    if os.environ.get("MAIBOT_TEST_FORKSERVER") == "0" or not args or args[0] != sys.executable:
        return False
    return args[1:3] == ["-m", "daphne"] or (len(args) > 1 and args[1] == "manage.py")


class _Server:
    def __init__(self, cwd: str) -> None:
        import subprocess
        import threading

        self.lock = threading.Lock()
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "tests.forkserver"],
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )

    def ask(self, request: dict) -> dict:
        with self.lock:
            self.popen.stdin.write(json.dumps(request) + "\n")
            self.popen.stdin.flush()
            line = self.popen.stdout.readline()
        if not line:
            raise RuntimeError(f"the test fork server exited ({self.popen.poll()})")
        return json.loads(line)


class ForkedPopen:
    """What the tests use of subprocess.Popen, for a child of the fork server."""

    def __init__(self, server: _Server, pid: int) -> None:
        self._server = server
        self.pid = pid
        self.returncode: int | None = None
        self._pidfd = os.pidfd_open(pid)

    def _ended(self, timeout: float | None) -> bool:
        import select

        readable, _, _ = select.select([self._pidfd], [], [], timeout)
        return bool(readable)

    def poll(self) -> int | None:
        if self.returncode is None and self._ended(0):
            self._reap()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        import subprocess

        if self.returncode is None:
            if not self._ended(timeout):
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            self._reap()
        return self.returncode

    def _reap(self) -> None:
        self.returncode = self._server.ask({"op": "reap", "pid": self.pid})["returncode"]
        os.close(self._pidfd)

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            import signal

            signal.pidfd_send_signal(self._pidfd, sig)

    def terminate(self) -> None:
        import signal

        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        import signal

        self.send_signal(signal.SIGKILL)


def spawn(args: list[str], env: dict[str, str], log: str, cwd: str) -> ForkedPopen:
    """Start `args` (see `usable`) as a child of this worker's fork server, its output appended to `log`."""
    global _server
    if _server is None or _server.popen.poll() is not None:
        _server = _Server(cwd)
    answer = _server.ask({"op": "spawn", "argv": args, "env": env, "log": log, "cwd": cwd})
    return ForkedPopen(_server, answer["pid"])


def close() -> None:
    """End this worker's fork server (its children are the tests' to stop), and wait for it."""
    global _server
    if _server is not None:
        _server.popen.stdin.close()
        _server.popen.wait()
        _server = None


if __name__ == "__main__":
    _preload()
    job = _serve()
    if job is not None:
        _become(job)
