"""One plugin runner subprocess seen from the host: spawn it (inside the plugin sandbox, plugins.sandbox),
talk to it (plugins.protocol messages in plugins.ipc frames over its pipes), answer its capability calls,
notice when it dies, kill it with everything it started. Lives on the host's plugin event loop. A frame
that is not a protocol message gets the runner killed (with the reason), as a crash."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import itertools
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from plugins import ipc, protocol, sandbox
from plugins.limits import CpuWindow, PluginLimits

logger = logging.getLogger(__name__)

PROJECT_ROOT = sandbox.PROJECT_ROOT
MAX_STDERR_LINE = 4000


class RunnerGone(RuntimeError):
    """The runner process exited (or was killed) before it answered."""


class PluginError(Exception):
    """An exception the plugin raised in its runner, re-raised in the host under the plugin's type name."""


_remote_types: dict[str, type[Exception]] = {}


def remote_error(error: dict[str, Any]) -> Exception:
    """The plugin's exception as the host raises it: the builtin class when it is one (ValueError…),
    otherwise a PluginError subclass of the same name, so the planner's error result reads as before."""
    name = str(error.get("type") or "Exception")[:100]
    message = str(error.get("message") or "")
    cls = getattr(builtins, name, None)
    if isinstance(cls, type) and issubclass(cls, Exception) and not issubclass(cls, TimeoutError | OSError):
        with contextlib.suppress(Exception):
            return cls(message)
    if not name.isidentifier():
        name = "PluginError"
    if name not in _remote_types:
        _remote_types[name] = type(name, (PluginError,), {})
    return _remote_types[name](message)


# What a program the plugin host starts (a runner, pip) inherits from the server's environment: the basics
# a Python program and an HTTP client need (and LC_*). Never the rest (API keys, DATABASE_URL, REDIS_URL,
# adapter tokens): plugin code and package installs have no business with the bot's secrets.
SAFE_ENVIRONMENT = (
    "PATH",
    "HOME",
    "USER",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TMPDIR",
    "SYSTEMROOT",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
)


def safe_environment(*, also: tuple[str, ...] = (), prefixes: tuple[str, ...] = ()) -> dict[str, str]:
    """The server's environment reduced to SAFE_ENVIRONMENT and LC_*, plus the names `also` and the
    variables starting with `prefixes`."""
    return {
        k: v for k, v in os.environ.items() if k in SAFE_ENVIRONMENT or k in also or k.startswith(("LC_", *prefixes))
    }


def runner_env() -> dict[str, str]:
    """The runner's environment: the basics (above, and LC_*), and the server's sys.path as PYTHONPATH
    so it sees the same packages (the project, the venv, a shiv extraction)."""
    env = safe_environment()
    paths = [str(PROJECT_ROOT), *(p for p in sys.path if p and os.path.isdir(p))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _error_reply(call_id: int, exc: BaseException) -> protocol.Reply:
    return protocol.Reply(id=call_id, ok=False, error={"type": type(exc).__name__, "message": str(exc)})


CallHandler = Callable[[str, dict[str, Any], Any], Awaitable[Any]]


class RunnerProcess:
    """A running runner. `call_handler(method, payload, timeout_ms)` answers the plugin's host calls."""

    _ids = itertools.count(1)

    def __init__(
        self,
        *,
        folder: Path,
        plugin_id: str,
        data_dir: Path,
        runtime_dir: Path,
        limits: PluginLimits,
        call_handler: CallHandler,
        on_exit: Callable[[RunnerProcess], None] | None = None,
    ) -> None:
        self.folder = folder
        self.plugin_id = plugin_id
        self.data_dir = data_dir
        self.runtime_dir = runtime_dir
        self.limits = limits
        self.call_handler = call_handler
        self.on_exit = on_exit
        self.proc: asyncio.subprocess.Process | None = None
        self.pending: dict[int, asyncio.Future] = {}
        self.stopping = False
        self.exit_code: int | None = None
        self.discarded = False  # killed, waited for and its pipes closed
        self.kill_reason = ""  # why the host killed it (a limit), for the exit's report
        self.jail: sandbox.Jail | None = None
        self.cpu = CpuWindow()
        self._tasks: set[asyncio.Task] = set()
        self._hello: asyncio.Future | None = None
        self._done: asyncio.Event = asyncio.Event()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.exit_code is None

    async def start(self) -> None:
        """Start the runner (inside the sandbox unless the deployment turned it off) and wait for its
        hello; its network (if isolated) is connected before this returns, so before any plugin code."""
        self._hello = asyncio.get_running_loop().create_future()
        # Its dirs are made (and handed to its uid) and its sandbox built in a thread: not on the loop.
        command, env = await asyncio.to_thread(self._command)
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=str(self.runtime_dir),
                env=env,
                limit=ipc.MAX_FRAME + ipc.HEADER_SIZE,
                pass_fds=self.jail.pass_fds if self.jail else (),
                # Unsandboxed, the runner leads a process group of its own: kill() ends the group.
                start_new_session=True,
            )
        finally:
            if self.jail is not None:
                self.jail.spawned()
        self._spawn(self._read_frames())
        self._spawn(self._read_stderr())
        self._spawn(self._wait_exit())
        await self._hello  # raises RunnerGone when it died first
        if self.jail is not None:
            await self.jail.connect_network()

    def _command(self) -> tuple[list[str], dict[str, str]]:
        """The runner's command line and environment (in its jail when sandboxed); its dirs made."""
        sandbox.prepare_dirs(self.plugin_id, self.data_dir, self.runtime_dir)
        limits = self.limits
        command = [
            sys.executable,
            "-m",
            "plugins.runner",
            str(self.folder),
            self.plugin_id,
            "--data-dir",
            str(self.data_dir),
            "--runtime-dir",
            str(self.runtime_dir),
            "--memory-mb",
            str(limits.memory_mb),
            "--max-processes",
            str(limits.max_processes),
            "--max-open-files",
            str(limits.max_open_files),
            "--max-file-mb",
            str(limits.max_file_mb),
        ]
        env = runner_env()
        if not sandbox.enabled():
            return command, env
        self.jail = sandbox.runner_jail(
            plugin_id=self.plugin_id,
            command=command,
            folder=self.folder,
            data_dir=self.data_dir,
            runtime_dir=self.runtime_dir,
            network=limits.network,
            tmp_mb=limits.max_file_mb,
        )
        return self.jail.argv, self.jail.env(env)

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # --- requests ----------------------------------------------------------------------------------

    async def request(self, build: Callable[[int], protocol.Request], timeout: float) -> Any:
        """Send the request `build(request_id)` and wait for its answer. On timeout the runner is told to
        cancel it, and TimeoutError raised; the caller decides whether the runner is stuck (see cancel())."""
        if not self.alive:
            raise RunnerGone(f"the runner of plugin {self.plugin_id} is not running")
        request_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self.pending[request_id] = future
        try:
            # Writing a big frame waits while the runner reads it: within the same timeout.
            async with asyncio.timeout(timeout):
                try:
                    await self._send(build(request_id))
                except (RunnerGone, ipc.FrameError):
                    self.pending.pop(request_id, None)  # never sent: nothing will answer it
                    raise
                return await asyncio.shield(future)
        except TimeoutError:
            raise TimeoutError(request_id) from None
        finally:
            if future.done():
                self.pending.pop(request_id, None)

    async def cancel(self, request_id: int, grace: float) -> bool:
        """Ask the runner to cancel a request; True when it confirmed within `grace` seconds (its loop
        is alive), False when it did not (a plugin blocks its loop: the caller kills it)."""
        future = self.pending.get(request_id)
        if future is None or future.done():
            self.pending.pop(request_id, None)
            return True
        try:
            async with asyncio.timeout(grace):
                await self._send(protocol.Cancel(id=request_id))
                await asyncio.shield(future)
        except asyncio.CancelledError:
            return True  # the runner confirmed ("cancelled")
        except TimeoutError:
            return False
        except Exception:
            return self.alive
        finally:
            self.pending.pop(request_id, None)
        return True

    async def _send(self, message: protocol.Message) -> None:
        """Write one frame, then wait until the pipe has taken most of it (backpressure: what waits
        to be written to a runner that does not read stays bounded by the calls waiting on it). The
        frame goes into the transport whole in one write(), so concurrent senders never interleave.
        FrameError when it is too big to send (nothing is written)."""
        if self.proc is None or self.proc.stdin is None or self.proc.stdin.is_closing():
            raise RunnerGone(f"the runner of plugin {self.plugin_id} is not running")
        frame = ipc.encode(message.wire())
        self.proc.stdin.write(frame)
        try:
            await self.proc.stdin.drain()
        except ConnectionError:
            raise RunnerGone(f"the runner of plugin {self.plugin_id} is not running") from None

    # --- what the runner says ----------------------------------------------------------------------

    async def _read_frames(self) -> None:
        stdout = self.proc.stdout
        try:
            while True:
                header = await stdout.readexactly(ipc.HEADER_SIZE)
                body = await stdout.readexactly(ipc.length(header))
                self._on_message(protocol.from_runner(ipc.decode(body)))
        except asyncio.IncompleteReadError:
            pass
        except protocol.ProtocolError as exc:
            logger.error("plugin %s: %s; stopping its runner", self.plugin_id, exc)
            self.kill(str(exc))
        except Exception:
            logger.exception("plugin %s: bad frame from its runner; stopping it", self.plugin_id)
            self.kill()

    def _on_message(self, message: protocol.Hello | protocol.Reply | protocol.Cancelled | protocol.Call) -> None:
        if isinstance(message, protocol.Hello):
            if self._hello is not None and not self._hello.done():
                self._hello.set_result(message.pid)
        elif isinstance(message, protocol.Call):
            self._spawn(self._answer_call(message))
        else:
            future = self.pending.get(message.id)
            if future is None or future.done():
                return
            if isinstance(message, protocol.Cancelled):
                future.cancel()
            elif message.ok:
                future.set_result(message.result)
            else:
                future.set_exception(remote_error(message.error or {}))

    async def _answer_call(self, message: protocol.Call) -> None:
        call_id = message.id
        try:
            result = await self.call_handler(message.method, message.payload, message.timeout_ms)
            reply = protocol.Reply(id=call_id, ok=True, result=result)
        except Exception as exc:
            reply = _error_reply(call_id, exc)
        try:
            await self._send(reply)
        except ipc.FrameError as exc:
            # The answer is too big for a frame: the plugin is told so rather than left waiting.
            with contextlib.suppress(Exception):
                await self._send(_error_reply(call_id, exc))
        except Exception:
            pass  # the runner is gone: nobody waits for this answer

    async def _read_stderr(self) -> None:
        plugin_logger = logging.getLogger(f"plugins.runner.{self.plugin_id}")
        stderr = self.proc.stderr
        while True:
            try:
                line = await stderr.readline()
            except ValueError:  # a line longer than the stream's limit
                continue
            if not line:
                return
            text = line.decode("utf-8", "replace").rstrip()[:MAX_STDERR_LINE]
            if text:
                plugin_logger.info("%s", text)

    async def _wait_exit(self) -> None:
        code = await self.proc.wait()
        self.exit_code = code
        why = f"was killed: {self.kill_reason}" if self.kill_reason else f"exited (code {code})"
        gone = RunnerGone(f"the runner of plugin {self.plugin_id} {why}")
        for future in self.pending.values():
            if not future.done():
                future.set_exception(gone)
        self.pending.clear()
        if self._hello is not None and not self._hello.done():
            self._hello.set_exception(gone)
        self._done.set()
        if self.on_exit is not None and not self.stopping:
            try:
                self.on_exit(self)
            except Exception:
                logger.exception("plugin %s: handling its runner's exit failed", self.plugin_id)

    # --- stopping ----------------------------------------------------------------------------------

    def kill(self, reason: str = "") -> None:
        """SIGKILL the runner and every process it started: the sandbox's pid namespace ends with bwrap
        (unsandboxed: its process group, which a process that left the group escapes)."""
        if self.proc is not None and self.exit_code is None:
            if reason and not self.kill_reason:
                self.kill_reason = reason
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()

    async def stop(self, timeout: float) -> None:
        """on_unload (at most `timeout` seconds), then the process ends; killed when it does not."""
        self.stopping = True
        if self.alive:
            with contextlib.suppress(Exception):
                await self.request(lambda request_id: protocol.Unload(id=request_id), timeout)
            with contextlib.suppress(Exception):
                self.proc.stdin.close()
            try:
                await asyncio.wait_for(self._done.wait(), timeout)
            except TimeoutError:
                self.kill()
        await self.discard()

    async def discard(self) -> None:
        """Kill it (if still running) and release its pipes."""
        self.stopping = True
        self.kill()
        if self.proc is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._done.wait(), 5)
            transport = getattr(self.proc, "_transport", None)
            if transport is not None:
                transport.close()
        for task in list(self._tasks):
            task.cancel()
        if self.jail is not None:
            await self.jail.close()
        self.discarded = True
