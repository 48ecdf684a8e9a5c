"""Plugin tools marked for the life loop reach the real life loop: a real qcluster whose worker starts a
plugin host of its own on its first life-loop model turn (plugins.host.start_for_life_loop), the
scripted LLM calling the plugin's tool through the real openai client, the tool running in a runner
(real maibot-plugin-sdk) under that worker, recorded like any tool; the runner gone with the cluster."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from chat.models import ToolCallRecord
from scheduling.life.timers import timer_create
from scheduling.services import SYSTEM
from tests.chat.gateway_helpers import write_bot_config
from tests.conftest import wait_for
from tests.fake_llm import FakeLLM
from tests.plugins.conftest import copy_plugins

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]

DIARY = Path(__file__).resolve().parent / "life_fixtures" / "diary"
DIARY_ID = "test.maibot.diary"


def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields after the command name (state, ppid, ...); None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def _gone(pid: int) -> bool:
    stat = _stat(pid)
    return stat is None or stat[0] == "Z"


def _ancestors(pid: int) -> list[int]:
    out = []
    while (stat := _stat(pid)) is not None and (pid := int(stat[1])) > 1:
        out.append(pid)
    return out


def _runners_of(plugin_id: str) -> list[int]:
    """The host pids of the runner processes of a plugin (python -m plugins.runner <folder> <id>)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"plugins.runner" in argv and plugin_id.encode() in argv and b"bwrap" not in argv[0]:
            found.append(int(entry.name))
    return found


def test_a_plugins_life_loop_tool_runs_in_the_cluster_worker(make_session, start_qcluster, tmp_path):
    data = tmp_path / "data-q1"
    write_bot_config(data, '[llm]\nmodel = "fake-model"\n\n[bot]\nnickname = "Mai"\n')
    copy_plugins(data / "plugins", "weather")  # no life-loop tool: not started in the worker
    shutil.copytree(DIARY, data / "plugins" / "diary", ignore=shutil.ignore_patterns("__pycache__"))
    diary = data / "plugin-runtime" / DIARY_ID / "diary.txt"
    with FakeLLM() as fake:
        fake.script(fake.tool_call("write_diary", {"line": "a quiet evening"}))
        cluster = start_qcluster(OPENAI_BASE_URL=fake.base_url)
        timer_create(spec="1s", label="evening", payload="write your diary", session=make_session(), acted_by=SYSTEM)
        # Its cycle's end too: the cycle's action is written then, after the call's record.
        calls = ToolCallRecord.objects.filter(name="write_diary", cycle__ended_at__isnull=False)
        assert wait_for(calls.exists, timeout=60)
        offered = {t["function"]["name"] for t in fake.requests[0]["tools"]}
    assert {"write_diary", "send_message"} <= offered and "get_weather" not in offered
    record = ToolCallRecord.objects.get(name="write_diary")
    assert (record.ok, record.result) == (True, {"ok": True, "result": {"content": "Mai noted: a quiet evening"}})
    assert record.cycle.kind == "life" and record.cycle.action == "tool"  # a tool other than the loop's own
    lines = [line.split() for line in diary.read_text().splitlines()]
    assert [line[0] for line in lines] == ["loaded", "note"] and lines[1][1] == "a_quiet_evening"
    (runner_pid,) = _runners_of(DIARY_ID)  # in the sandbox the diary sees namespace pids only
    assert cluster.popen.pid in _ancestors(runner_pid)  # a worker's runner, not the test's
    assert not (data / "plugin-runtime" / "test.maibot.weather").exists()

    cluster.stop()
    assert wait_for(lambda: _gone(runner_pid), timeout=20), "the runner outlived its worker"
    assert diary.read_text().splitlines()[-1].split()[0] == "unloaded"  # on_unload ran at the worker's exit
