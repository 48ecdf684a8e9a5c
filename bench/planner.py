"""Benchmark: the planner's own overhead per cycle, LLM calls per plain reply, prompt size per cycle.

A fresh SQLite database in a temporary data dir, one private session with a 100-message history
(`chat.history_window` = 100), FakeLLM (tests/fake_llm.py, the real openai client over HTTP on
127.0.0.1) answering every call at once with a `reply` tool call, debounce 0. Each round stores one
inbound message, sends `inbound_stored` and waits for the cycle to be recorded.

Overhead per cycle = observe + prompt + execute + record phases, i.e. the cycle's wall time minus the
LLM's own HTTP time (LLMResult.latency_ms, measured around the SDK call), from PlannerCycle.timings.
The ledger write of each call counts as overhead. Prompt tokens: FakeLLM reports a fixed usage, so
they are ESTIMATED from the rendered prompt (system + user messages + tool schemas): one token per
CJK character, one per 4 other characters.

    .venv/bin/python bench/planner.py [--cycles 200] [--history 100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import embedded_default, pct  # noqa: E402

FAKE_LLM_SERVER = """
import sys, time
from tests.fake_llm import FakeLLM
fake = FakeLLM().start()
fake.default = lambda body: fake.tool_call("reply", {"text": "好的 ok"})
print(fake.base_url, flush=True)
while True:
    time.sleep(3600)
"""
_CJK = re.compile(r"[\u3000-\u9fff\uff00-\uffef]")


def estimate_tokens(text: str) -> int:
    cjk = len(_CJK.findall(text))
    return cjk + (len(text) - cjk + 3) // 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--history", type=int, default=100)
    parser.add_argument(
        "--without-context-blocks",
        action="store_true",
        help="drop other apps' prompt blocks (inner state, memory…) to measure the planner alone",
    )
    args = parser.parse_args()

    embedded_default("maibot-bench-planner-", unset=("OPENAI_BASE_URL", "MAIBOT_LLM_MODEL"), LOG_LEVEL="WARNING")
    from asgiref.sync import sync_to_async
    from django.utils import timezone

    from chat import components as context
    from chat.components import ToolContext
    from chat.components import registry as tools
    from chat.models import Direction, LLMCall, Message, PlannerCycle, SourceKind
    from chat.runtime import runtimes
    from chat.services import inbound_stored, message_send, session_get_or_create
    from core import config

    if args.without_context_blocks:
        context._blocks.clear()

    def tool_schemas(session):
        return [t.schema() for t in tools.available(ToolContext(session=session))]

    # FakeLLM in its own process, like a remote provider: in this process its threads would compete
    # with the runtime for the GIL and inflate the figures.
    llm_proc = subprocess.Popen(
        [sys.executable, "-c", FAKE_LLM_SERVER],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    base_url = llm_proc.stdout.readline().strip()
    config.set_config(
        config.BotConfig.model_validate(
            {
                "llm": {"base_url": base_url, "model": "fake-model", "max_retries": 0},
                "chat": {"debounce_seconds": 0, "history_window": args.history},
            }
        )
    )

    session = session_get_or_create(platform="bench", chat_type="private", user_id="1", user_nickname="Alice")
    for i in range(args.history):
        if i % 2:
            message_send(session=session, source_kind=SourceKind.REPLY, text=f"回复 {i}: sure, sounds good")
        else:
            Message.objects.create(
                session=session,
                direction=Direction.IN,
                source_kind=SourceKind.USER,
                platform_message_id=str(10_000 + i),
                sender_id="1",
                sender_nickname="Alice",
                text=f"message {i}: 今天天气不错，我们去公园散步吧 shall we?",
                time=timezone.now(),
            )

    def store(i: int) -> Message:
        return Message.objects.create(
            session=session,
            direction=Direction.IN,
            source_kind=SourceKind.USER,
            platform_message_id=str(50_000 + i),
            sender_id="1",
            sender_nickname="Alice",
            text=f"ping {i} 你好",
            time=timezone.now(),
        )

    # Learn that a cycle is recorded without polling (polling would compete for the CPU and the GIL).
    from chat import planner

    original_run_cycle = planner.run_cycle
    cycle_done = asyncio.Event()

    async def run_cycle_and_signal(**kwargs):
        try:
            return await original_run_cycle(**kwargs)
        finally:
            cycle_done.set()

    planner.run_cycle = run_cycle_and_signal

    async def run() -> list[float]:
        nonlocal cpu_seconds
        walls = []
        cpu_start = time.process_time()
        for i in range(args.cycles):
            message = await sync_to_async(store)(i)
            t0 = time.perf_counter()
            inbound_stored.send(sender=Message, messages=[message])
            await cycle_done.wait()
            cycle_done.clear()
            walls.append((time.perf_counter() - t0) * 1000)
        cpu_seconds = time.process_time() - cpu_start
        await runtimes.shutdown()
        return walls

    cpu_seconds = 0.0
    walls = asyncio.run(run())
    llm_proc.terminate()
    llm_proc.wait()

    cycles = list(PlannerCycle.objects.filter(session=session).order_by("started_at"))
    overhead = [c.timings.get("observe_ms", 0) + c.timings["total_ms"] - c.timings["llm_ms"] for c in cycles]
    llm_ms = [c.timings["llm_ms"] for c in cycles]
    replies = [c for c in cycles if c.action == "reply"]
    calls_per_reply = LLMCall.objects.filter(cycle__in=replies).count() / max(len(replies), 1)
    prompt_tokens = [
        estimate_tokens(
            json.dumps(c.prompt[:2], ensure_ascii=False) + json.dumps(tool_schemas(session), ensure_ascii=False)
        )
        for c in cycles
    ]
    phases = {
        k: sum(c.timings.get(k, 0) for c in cycles) / len(cycles)
        for k in ("observe_ms", "prompt_ms", "execute_ms", "record_ms")
    }

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, SQLite")
    print(f"cycles: {len(cycles)} ({len(replies)} replies), history window {args.history} messages")
    blocks = ", ".join(sorted(context._blocks)) or "none"
    print(f"context blocks rendered each cycle (queried by their providers): {blocks}")
    print(
        f"overhead per cycle excl. LLM time: p50 {pct(overhead, 0.5):.2f} ms, p99 {pct(overhead, 0.99):.2f} ms "
        f"(target p50 <= 10 ms)"
    )
    print("  mean per phase: " + ", ".join(f"{k[:-3]} {v:.2f} ms" for k, v in phases.items()))
    print(
        f"CPU time of this process per cycle (all threads, incl. the openai client): "
        f"{cpu_seconds * 1000 / len(cycles):.2f} ms"
    )
    print(f"LLM HTTP time per cycle (FakeLLM, instant): p50 {pct(llm_ms, 0.5):.1f} ms")
    print(f"wake → cycle recorded (wall, incl. LLM): p50 {pct(walls, 0.5):.2f} ms, p99 {pct(walls, 0.99):.2f} ms")
    strict = [w - c.timings["llm_ms"] for w, c in zip(walls, cycles, strict=True)]
    print(
        f"stricter: wake → recorded wall time minus LLM HTTP time (adds signal, wake-up, final UPDATE): "
        f"p50 {pct(strict, 0.5):.2f} ms, p99 {pct(strict, 0.99):.2f} ms"
    )
    print(f"LLM calls per plain reply: {calls_per_reply:.2f} (target 1)")
    print(
        f"prompt tokens per cycle (ESTIMATED from the rendered prompt + tool schemas): "
        f"p50 {pct(prompt_tokens, 0.5)}, max {max(prompt_tokens)}"
    )


if __name__ == "__main__":
    main()
