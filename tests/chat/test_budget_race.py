"""Two processes racing one daily cap never overspend it by more than one call each (the counter is a
database row admitted by a conditional UPDATE). Runs on SQLite and, with DATABASE_URL, on PostgreSQL."""

import subprocess
import sys
from pathlib import Path

import pytest
from django.db.models import Sum

from chat.models import LLMCall, LLMSpend
from tests.conftest import subprocess_env
from tests.fake_llm import FakeLLM

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]
WORKER = Path(__file__).with_name("budget_worker.py")
CALL_TOKENS = 120  # FakeLLM's usage: 100 prompt + 20 completion tokens
CAP = 1000


def test_two_processes_racing_one_cap_overspend_by_at_most_one_call_each(tmp_path):
    with FakeLLM() as provider:
        # Each answer takes a moment, so both processes' calls are in flight together in every round.
        provider.default = lambda body: provider.delay(0.05, provider.text("spent"))
        procs = [
            subprocess.Popen(
                [sys.executable, str(WORKER), provider.base_url, str(CAP)],
                env=subprocess_env(MAIBOT_DATA_DIR=str(tmp_path / f"w{i}")),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i in range(2)
        ]
        outcomes: list[list[str]] = [[], []]
        try:
            for p in procs:
                assert p.stdout.readline().strip() == "ready", p.stderr.read()
            for _ in range(30):  # far more rounds than the cap allows calls
                for p in procs:
                    p.stdin.write("go\n")
                    p.stdin.flush()
                for i, p in enumerate(procs):
                    line = p.stdout.readline().strip()
                    assert line in ("made", "refused"), line + p.stderr.read()
                    outcomes[i].append(line)
                if all(o[-1] == "refused" for o in outcomes):
                    break
        finally:
            for p in procs:
                p.stdin.write("stop\n")
                p.stdin.flush()
                p.communicate(timeout=60)
    made = sum(o.count("made") for o in outcomes)
    spent = LLMCall.objects.aggregate(t=Sum("prompt_tokens") + Sum("completion_tokens"))["t"]
    assert spent == made * CALL_TOKENS == len(provider.requests) * CALL_TOKENS
    # Every call was admitted while the counter was under the cap; at most one per process was then
    # still in flight, so the day ends below the cap plus one call per process.
    assert CAP <= spent < CAP + 2 * CALL_TOKENS
    assert all("refused" in o for o in outcomes)  # both processes were stopped by the cap
    counter = LLMSpend.objects.get(scope="task", target="utility")
    assert counter.tokens == spent and counter.refused >= 2
