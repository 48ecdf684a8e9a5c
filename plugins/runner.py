"""A plugin runner: the subprocess one plugin's code runs in (`python -m plugins.runner <folder> <id> …`).

It imports the plugin folder as a package, creates the plugin, gives it a PluginContext whose
`rpc_call` sends `cap.call` back to the host over the pipe, and runs the components the host invokes
on its own event loop. The host speaks to it with plugins.protocol messages in plugins.ipc frames on its
stdin/stdout (a frame that is not one is answered with an error, never acted on); the plugin's
own prints and logs go to stderr, which the host logs. When the host goes away (stdin closes), the
runner exits, even if a plugin blocks its loop. Never imports Django: a runner is a bare interpreter
with the SDK.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib
import importlib.machinery
import importlib.util
import json
import logging
import os
import re
import sys
import threading
import tomllib
import traceback
import warnings
from pathlib import Path
from typing import Any, BinaryIO

from plugins import ipc, protocol

logger = logging.getLogger("maibot.plugin_runner")

MAX_CONFIG_BYTES = 1024 * 1024
EXIT_GRACE = 5.0  # seconds the runner waits for its loop to stop once the host has gone, then exits


def module_prefix(plugin_id: str) -> str:
    safe = re.sub(r"[^0-9A-Za-z_]", "_", plugin_id)
    return f"_maibot_plugin_{safe}"


class _SourceOnlyLoader(importlib.machinery.SourceFileLoader):
    """Compiles a plugin module from its source every time, never from __pycache__: a file rewritten
    within the same second at the same size (a hot-reload edit) would otherwise load the old bytecode."""

    def get_code(self, fullname: str) -> Any:
        return self.source_to_code(self.get_data(self.path), self.path)


class _PluginFinder:
    """Finds the plugin package's modules (and only those) with _SourceOnlyLoader."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not fullname.startswith(self.prefix + ".") or path is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.origin and spec.origin.endswith(".py"):
            spec.loader = _SourceOnlyLoader(fullname, spec.origin)
        return spec


def import_plugin(folder: Path, plugin_id: str) -> Any:
    """Import the folder as a package (so `from .helpers import x` works) and return its plugin module."""
    prefix = module_prefix(plugin_id)
    sys.meta_path.insert(0, _PluginFinder(prefix))
    sys.dont_write_bytecode = True  # nor write stale caches into the plugin's folder
    init = folder / "__init__.py"
    if init.is_file():
        spec = importlib.util.spec_from_file_location(
            prefix, init, loader=_SourceOnlyLoader(prefix, str(init)), submodule_search_locations=[str(folder)]
        )
    else:
        spec = importlib.machinery.ModuleSpec(prefix, None, is_package=True)
        spec.submodule_search_locations = [str(folder)]
    package = importlib.util.module_from_spec(spec)
    sys.modules[prefix] = package
    if spec.loader is not None:
        spec.loader.exec_module(package)
    return importlib.import_module(f"{prefix}.plugin")


def parse_config(text: str) -> dict[str, Any]:
    if len(text.encode("utf-8")) > MAX_CONFIG_BYTES:
        raise ValueError(f"config.toml is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"config.toml: {exc}") from None


def config_description(instance: Any, plugin_id: str) -> dict[str, Any]:
    """The plugin's default config and its config schema, as MaiBot's runner reports them ({} when the
    SDK's methods fail or give something else)."""
    found: dict[str, Any] = {"default_values": {}, "config_schema": {}}
    calls = {
        "default_values": lambda: instance.get_default_config(),
        "config_schema": lambda: instance.get_webui_config_schema(plugin_id=plugin_id),
    }
    for key, call in calls.items():
        try:
            value = call()
        except Exception as exc:  # a plugin's own bug: it still loads
            logger.warning("plugin %s: %s failed: %s", plugin_id, key, exc)
            continue
        if isinstance(value, dict):
            found[key] = json.loads(json.dumps(value, default=str))
    return found


def default_config_text(instance: Any) -> str:
    """config.toml as the plugin's config_model's defaults (what MaiBot writes on first load)."""
    import tomlkit

    def clean(value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k): clean(v) for k, v in value.items() if v is not None}
        if isinstance(value, list | tuple):
            return [clean(v) for v in value if v is not None]
        return value

    data = clean(type(instance).build_default_config())
    if not data:
        return ""
    return "# Generated from the plugin's config_model on first load; edit it (or in the admin) to configure.\n" + (
        tomlkit.dumps(data)
    )


def _error(exc: BaseException) -> protocol.ErrorInfo:
    return {"type": type(exc).__name__, "message": str(exc)[:2000]}


class Runner:
    def __init__(self, folder: Path, plugin_id: str, data_dir: Path, runtime_dir: Path, out: BinaryIO) -> None:
        self.folder = folder
        self.plugin_id = plugin_id
        self.data_dir = data_dir
        self.runtime_dir = runtime_dir
        self.out = out
        self.instance: Any = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.tasks: dict[int, asyncio.Task] = {}
        self.calls: dict[int, asyncio.Future] = {}
        self._next_call = 0
        self._write_lock = threading.Lock()
        self.stopped: asyncio.Event | None = None

    # --- the pipe ------------------------------------------------------------------------------------

    def send(self, message: protocol.Message) -> None:
        """Write one message. An answer that cannot be encoded (too big) goes as an error answer; a call
        of the plugin's that cannot raises here, in the plugin (nothing would ever answer it)."""
        try:
            frame = ipc.encode(message.wire())
        except (ipc.FrameError, TypeError, ValueError) as exc:
            request_id = getattr(message, "id", None)
            if request_id is None or isinstance(message, protocol.Call):
                if isinstance(message, protocol.Call):
                    raise
                return
            frame = ipc.encode(protocol.Reply(id=request_id, ok=False, error=_error(exc)).wire())
        with self._write_lock:
            ipc.write_all(self.out, frame)

    def read_frames(self, stream: BinaryIO) -> None:
        """The reader thread: whole frames from the host, checked, to the loop; when the host goes away
        (end of file, even within a frame), stop (and exit if the loop is stuck)."""
        try:
            while (frame := ipc.read_frame(stream)) is not None:
                try:
                    message = protocol.from_host(frame)
                except protocol.ProtocolError as exc:
                    self.refuse(frame, exc)
                    continue
                self.loop.call_soon_threadsafe(self.dispatch, message)
        except EOFError:
            pass  # the host went away while writing
        except Exception:
            logger.exception("plugin runner %s: reading from the host failed", self.plugin_id)
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.stopped.set)
        threading.Timer(EXIT_GRACE, lambda: os._exit(0)).start()

    def refuse(self, frame: dict[str, Any], exc: protocol.ProtocolError) -> None:
        """A frame that is not a message: answered with the error when it names a request, else logged."""
        logger.error("plugin runner %s: %s", self.plugin_id, exc)
        request_id = frame.get("id")
        if isinstance(request_id, int) and not isinstance(request_id, bool):
            self.send(protocol.Reply(id=request_id, ok=False, error=_error(exc)))

    def dispatch(self, message: protocol.Load | protocol.Invoke | protocol.Unload | protocol.Cancel | protocol.Reply):
        if isinstance(message, protocol.Reply):
            future = self.calls.pop(message.id, None)
            if future is not None and not future.done():
                if message.ok:
                    future.set_result(message.result)
                else:
                    error = message.error or {}
                    future.set_exception(RuntimeError(str(error.get("message") or "the host call failed")))
            return
        if isinstance(message, protocol.Cancel):
            task = self.tasks.get(message.id)
            if task is not None:
                task.cancel()
            else:
                self.send(protocol.Cancelled(id=message.id))
            return
        handler = {protocol.Load: self.load, protocol.Invoke: self.invoke, protocol.Unload: self.unload}[type(message)]
        request_id = message.id
        task = asyncio.ensure_future(self._answer(request_id, handler(message)))
        self.tasks[request_id] = task
        task.add_done_callback(lambda _t, rid=request_id: self.tasks.pop(rid, None))

    async def _answer(self, request_id: int, work) -> None:
        try:
            result = await work
        except asyncio.CancelledError:
            self.send(protocol.Cancelled(id=request_id))
            return
        except BaseException as exc:
            logger.debug("plugin %s: request %s failed", self.plugin_id, request_id, exc_info=True)
            self.send(protocol.Reply(id=request_id, ok=False, error=_error(exc)))
            if not isinstance(exc, Exception):
                raise
            return
        self.send(protocol.Reply(id=request_id, ok=True, result=result))

    async def rpc_call(self, method: str, plugin_id: str = "", payload: dict[str, Any] | None = None, timeout_ms=None):
        """The PluginContext's rpc_call: the request goes to the host, which answers it (capabilities)."""
        self._next_call += 1
        call_id = self._next_call
        future = self.loop.create_future()
        self.calls[call_id] = future
        self.send(protocol.Call(id=call_id, method=method, payload=payload or {}, timeout_ms=timeout_ms))
        try:
            # The host applies the capability's own timeout and always answers; this only guards a lost answer.
            return await asyncio.wait_for(future, 330)
        finally:
            self.calls.pop(call_id, None)

    # --- requests ------------------------------------------------------------------------------------

    async def load(self, message: protocol.Load) -> dict[str, Any]:
        from maibot_sdk import MaiBotPlugin, PluginContext, PluginPaths

        with warnings.catch_warnings(record=True) as caught:
            # The SDK warns at import about what it deprecates (e.g. @Action): shown with the plugin.
            warnings.simplefilter("always")
            module = import_plugin(self.folder, self.plugin_id)
        found_warnings = sorted({str(w.message) for w in caught})
        factory = getattr(module, "create_plugin", None)
        if not callable(factory):
            raise TypeError("plugin.py has no create_plugin() function")
        instance = factory()
        if not isinstance(instance, MaiBotPlugin):
            raise TypeError(f"create_plugin() returned {type(instance).__name__}, not a MaiBotPlugin")
        # The host reads config.toml and sends it (None: there is none); the generated default goes back
        # for the host to write. The runner never writes into the plugin's folder (read-only to it).
        config_text = message.config_text
        default_config = config_text is None
        if default_config:
            config_text = default_config_text(instance)
        config = parse_config(config_text)
        normalized, _ = instance.normalize_plugin_config(config)  # raises with the reason when invalid
        # [plugin] enabled / allow_hot_reload are read from the file as written too: a config_model that
        # does not declare them drops them (the SDK's models ignore unknown keys).
        sections = [s for s in (config.get("plugin"), normalized.get("plugin")) if isinstance(s, dict)]
        allow_hot_reload = bool(getattr(instance, "allow_hot_reload", True))
        for section in sections:
            if "allow_hot_reload" in section:
                allow_hot_reload = bool(section["allow_hot_reload"])
        result: dict[str, Any] = {
            "warnings": found_warnings,
            "config_text": config_text,
            "default_config": default_config,
            "config": normalized,
            "allow_hot_reload": allow_hot_reload,
            "disabled": any(section.get("enabled") is False for section in sections),
            "components": [],
            **config_description(instance, self.plugin_id),
        }
        if result["disabled"]:
            return result
        instance.set_plugin_config(config)
        paths = PluginPaths(data_dir=self.data_dir, runtime_dir=self.runtime_dir)
        instance._set_context(PluginContext(self.plugin_id, rpc_call=self.rpc_call, paths=paths))
        self.instance = instance
        if type(instance).on_load is not MaiBotPlugin.on_load:
            await instance.on_load()
        result["components"] = [
            {"name": str(c.get("name", "")), "type": str(c.get("type", "")), "metadata": dict(c.get("metadata", {}))}
            for c in instance.get_components()
        ]
        return result

    async def invoke(self, message: protocol.Invoke) -> Any:
        """Call a component's handler with keyword arguments (as MaiBot's runner does)."""
        name = message.component
        handler_name = message.handler
        handler = getattr(self.instance, handler_name or name, None) if handler_name or name else None
        if handler is None:
            handler = getattr(self.instance, f"handle_{name}", None)
        if handler is None and handler_name in (getattr(self.instance, "_dynamic_api_handlers", None) or {}):
            # A dynamic API (api.replace_dynamic): the SDK's own dispatch answers it.
            handler = functools.partial(self.instance.invoke_component, handler_name)
        if handler is None or not callable(handler):
            raise LookupError(f"plugin {self.plugin_id} has no handler for {name}")
        result = handler(**message.args)
        if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
            result = await result
        return result

    async def unload(self, message: protocol.Unload) -> None:
        from maibot_sdk import MaiBotPlugin

        instance, self.instance = self.instance, None
        if instance is not None and type(instance).on_unload is not MaiBotPlugin.on_unload:
            await instance.on_unload()
        self.loop.call_soon(self.stopped.set)

    async def serve(self, stream: BinaryIO) -> None:
        self.loop = asyncio.get_running_loop()
        self.stopped = asyncio.Event()
        threading.Thread(target=self.read_frames, args=(stream,), name="runner-reader", daemon=True).start()
        self.send(protocol.Hello(pid=os.getpid()))
        await self.stopped.wait()
        await asyncio.sleep(0)  # let the last reply be written


def apply_limits(args: argparse.Namespace) -> None:
    """The runner's resource limits, before any plugin code runs (inherited by every process it starts,
    which may lower them, never raise them): address space per process (MemoryError past it), processes
    and threads of its user (RLIMIT_NPROC: the sandbox gives each plugin a user of its own), open files,
    the size of a file it writes (Python gets EFBIG: it ignores SIGXFSZ), and no core dumps."""
    import resource

    mb = 1024 * 1024
    wanted = [
        (resource.RLIMIT_AS, args.memory_mb * mb),
        (resource.RLIMIT_NPROC, args.max_processes),
        (resource.RLIMIT_NOFILE, args.max_open_files),
        (resource.RLIMIT_FSIZE, args.max_file_mb * mb),
        (resource.RLIMIT_CORE, 0),
    ]
    for which, limit in wanted:
        if limit > 0 or which == resource.RLIMIT_CORE:
            try:
                resource.setrlimit(which, (limit, limit))
            except (ValueError, OSError) as exc:
                logger.warning("plugin runner: resource limit %s=%s not applied: %s", which, limit, exc)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m plugins.runner")
    parser.add_argument("folder", type=Path)
    parser.add_argument("plugin_id")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--runtime-dir", type=Path, required=True)
    parser.add_argument("--memory-mb", type=int, default=0)
    parser.add_argument("--max-processes", type=int, default=0)
    parser.add_argument("--max-open-files", type=int, default=0)
    parser.add_argument("--max-file-mb", type=int, default=0)
    args = parser.parse_args(argv)
    # The protocol owns the original stdin/stdout; the plugin's prints go to stderr, its input is empty.
    proto_in = os.fdopen(os.dup(0), "rb", buffering=0)
    proto_out = os.fdopen(os.dup(1), "wb", buffering=0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    apply_limits(args)
    runner = Runner(args.folder, args.plugin_id, args.data_dir, args.runtime_dir, proto_out)
    try:
        asyncio.run(runner.serve(proto_in))
    except Exception:
        traceback.print_exc()
        os._exit(1)
    os._exit(0)  # never wait on the reader thread or a plugin's leftover threads


if __name__ == "__main__":
    main()
