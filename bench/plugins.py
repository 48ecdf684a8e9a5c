"""Benchmark: what plugins cost. The overhead of a plugin tool call and of a plugin command match
(p50/p99), and the bot's reply latency with 20 plugins loaded vs none.

A fresh SQLite database in a temporary data dir; 20 plugins generated into a temporary folder, each
written against the real maibot-plugin-sdk with a tool, a command (`/benchN …`, intercepting), a
blocking `chat.receive.after_process` hook and an observing `@EventHandler(ON_MESSAGE)` (so every
inbound message passes through 20 blocking hooks and 20 observers). The plugins run in this process's
plugin host (plugins.host) as the server runs them.

* tool call, as the chat planner makes it: `AgentTurn.arun` of a plugin tool that returns at once
  (awaited: the host's hop to the plugins' loop and back), next to a built-in tool that does the same
  (`AgentTurn.run` in the runtime's DB thread: that hop, and the engine's hop to its tool thread).
* command match: the before-planner commands (`run_commands`) asked about a message one plugin command
  matches (the turn opened and recorded, the handler awaited, the message intercepted), and about one
  no command wants (20 patterns tried, nothing opened).
* reply latency: one private session, FakeLLM in its own process answering every call at once with a
  `reply` tool call, debounce 0; each round stores one inbound message, sends `inbound_stored` and
  waits until the cycle is recorded (wall time). After a warm-up run, first with no plugin loaded, then
  with the 20.

    .venv/bin/python bench/plugins.py [--calls 2000] [--cycles 100] [--plugins 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import embedded_default, pct  # noqa: E402
from bench.planner import FAKE_LLM_SERVER  # noqa: E402

MANIFEST = {
    "manifest_version": 2,
    "version": "1.0.0",
    "description": "A generated benchmark plugin",
    "author": {"name": "maibot bench"},
    "license": "MIT",
    "host_application": {"min_version": "1.0.0", "max_version": "1.99.99"},
    "sdk": {"min_version": "2.0.0", "max_version": "2.99.99"},
    "capabilities": ["send.text"],
}

PLUGIN = """
from maibot_sdk import Command, EventHandler, HookHandler, MaiBotPlugin, Tool
from maibot_sdk.types import EventType, HookMode


class BenchPlugin(MaiBotPlugin):
    async def on_load(self):
        self.seen = 0

    async def on_unload(self):
        pass

    async def on_config_update(self, scope, config_data, version):
        pass

    @Tool("bench_tool_{n}", description="Answers at once", parameters={{"q": {{"type": "string"}}}})
    async def tool(self, q: str = "", **kwargs):
        return {{"content": q}}

    @Command("bench{n}", description="Answers at once", pattern=r"^/bench{n}\\b")
    async def command(self, **kwargs):
        return True, None, True

    @HookHandler("chat.receive.after_process", name="hook_{n}", mode=HookMode.BLOCKING)
    async def hook(self, message=None, **kwargs):
        return {{"action": "continue"}}

    @EventHandler("observer_{n}", event_type=EventType.ON_MESSAGE)
    async def observe(self, message=None, **kwargs):
        self.seen += 1


def create_plugin():
    return BenchPlugin()
"""


def generate_plugins(directory: Path, count: int) -> None:
    for n in range(count):
        folder = directory / f"bench_{n}"
        folder.mkdir(parents=True)
        manifest = {**MANIFEST, "id": f"bench.maibot.plugin-{n}", "name": f"Bench plugin {n}"}
        (folder / "_manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
        (folder / "plugin.py").write_text(PLUGIN.format(n=n), encoding="utf-8")


async def atimed(call, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await call()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def fmt(values: list[float]) -> str:
    return f"p50 {pct(values, 0.5):.3f} ms, p99 {pct(values, 0.99):.3f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--plugins", type=int, default=20)
    args = parser.parse_args()

    embedded_default("maibot-bench-plugins-", unset=("OPENAI_BASE_URL", "MAIBOT_LLM_MODEL"), LOG_LEVEL="WARNING")
    from asgiref.sync import sync_to_async
    from django.utils import timezone

    from chat import planner
    from chat.agent.engine import AgentTurn
    from chat.commands import run_commands
    from chat.components import Tool, ok
    from chat.components import registry as tools
    from chat.models import CycleKind, Direction, Message, PlannerCycle, SourceKind
    from chat.runtime import runtimes
    from chat.services import inbound_stored, session_get_or_create
    from core import config
    from plugins.host import PluginHost

    llm_proc = subprocess.Popen([sys.executable, "-c", FAKE_LLM_SERVER], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    base_url = llm_proc.stdout.readline().strip()
    config.set_config(
        config.BotConfig.model_validate(
            {"llm": {"base_url": base_url, "model": "fake-model", "max_retries": 0}, "chat": {"debounce_seconds": 0}}
        )
    )
    session = session_get_or_create(platform="bench", chat_type="private", user_id="1", user_nickname="Alice")
    counter = iter(range(10**6))

    def store(text: str) -> Message:
        return Message.objects.create(
            session=session,
            direction=Direction.IN,
            source_kind=SourceKind.USER,
            platform_message_id=str(next(counter)),
            sender_id="1",
            sender_nickname="Alice",
            segments=[{"type": "text", "data": text}],
            text=text,
            time=timezone.now(),
        )

    original_run_cycle = planner.run_cycle
    cycle_done: asyncio.Event | None = None

    async def run_cycle_and_signal(**kwargs):
        try:
            return await original_run_cycle(**kwargs)
        finally:
            cycle_done.set()

    planner.run_cycle = run_cycle_and_signal
    plugin_dir = Path(tempfile.mkdtemp(prefix="maibot-bench-plugin-dir-"))
    generate_plugins(plugin_dir, args.plugins)
    host = PluginHost()

    async def reply_latency(label: str) -> list[float]:
        walls = []
        for i in range(args.cycles):
            message = await sync_to_async(store)(f"{label} ping {i}")
            t0 = time.perf_counter()
            inbound_stored.send(sender=Message, messages=[message])
            await cycle_done.wait()
            cycle_done.clear()
            walls.append((time.perf_counter() - t0) * 1000)
        return walls

    async def both() -> tuple[list[float], list[float], float]:
        # One event loop for both runs: the session runtimes stay bound to it.
        nonlocal cycle_done
        cycle_done = asyncio.Event()
        await reply_latency("warm-up")  # the first cycles set up the model client and the runtime
        without = await reply_latency("without")
        t0 = time.perf_counter()
        await asyncio.to_thread(host.load_all, plugin_dir)
        load_s = time.perf_counter() - t0
        with_plugins = await reply_latency("with")
        await runtimes.shutdown()
        return without, with_plugins, load_s

    try:
        without, with_plugins, load_s = asyncio.run(both())
    except BaseException:
        llm_proc.terminate()
        host.stop()
        raise
    loaded = sum(1 for r in host.records.values() if r.state == "loaded")
    replies = PlannerCycle.objects.filter(action="reply").count() - args.cycles  # less the warm-up

    tools.register(Tool(name="bench_builtin", description="Answers at once", parameters={}, func=lambda ctx, **a: ok()))
    turn = AgentTurn.open(kind=CycleKind.CHAT, session=session, trigger="bench")
    matching = store("/bench7 go")
    plain = store("just chatting, no command here")
    n_commands = max(50, args.calls // 10)

    async def calls() -> tuple[list[float], ...]:
        assert (await turn.arun("bench_tool_0", {"q": "x"})).ok
        run = sync_to_async(turn.run)
        return (
            await atimed(lambda: turn.arun("bench_tool_0", {"q": "x"}), args.calls),
            await atimed(lambda: run("bench_builtin", {}), args.calls),
            await atimed(lambda: run_commands(session=session, new_messages=[matching]), n_commands),
            await atimed(lambda: run_commands(session=session, new_messages=[plain]), args.calls),
        )

    plugin_tool, builtin_tool, command_hit, command_miss = asyncio.run(calls())
    host.stop()
    llm_proc.terminate()
    llm_proc.wait()

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, SQLite")
    each = "each: tool, command, blocking hook, observer"
    print(f"plugins: {loaded} of {args.plugins} loaded in {load_s:.2f} s ({each})")
    print(f"plugin tool call (AgentTurn.arun, not recorded): {fmt(plugin_tool)} over {args.calls} calls")
    print(f"  built-in tool, same work (AgentTurn.run in the DB thread): {fmt(builtin_tool)}")
    print(f"command match, intercepted (turn opened and recorded, handler run): {fmt(command_hit)} over {n_commands}")
    print(f"command match, no command wants the message ({args.plugins} patterns tried): {fmt(command_miss)}")
    print(f"reply latency, wake → cycle recorded (FakeLLM instant), {args.cycles} cycles each:")
    print(f"  no plugins:          {fmt(without)}")
    print(f"  {loaded} plugins loaded:  {fmt(with_plugins)}")
    print(f"  replies measured: {replies} (load average now {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
