"""The typed host ⇄ runner protocol (plugins.protocol) at both ends of a real runner's pipe: a frame that
is not a message is refused, never acted on. From a runner (where a hostile plugin can write), the host
kills that runner and restarts it as after a crash, saying why, and goes on; from the host, the runner
answers the request with the error and goes on serving."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from core import config
from plugins import ipc, protocol
from plugins.host import PluginState
from plugins.supervisor import RunnerGone
from tests.conftest import wait_for
from tests.plugins.conftest import IPC_FIXTURES, load_ipc_plugins

FORGER = "test.maibot.forger"
PROJECT_ROOT = IPC_FIXTURES.parent.parent.parent

# Frames a hostile plugin writes to the host, and where the host finds them wrong.
FORGED = [
    ({"type": "reply", "id": "1", "ok": True}, "reply.id: Input should be a valid integer"),
    ({"type": "shutdown", "id": 1}, "Input tag 'shutdown' found using 'type' does not match"),
    ({"type": "call", "id": 1, "method": "cap.call", "payload": ["x"]}, "call.payload: Input should be a valid dict"),
    ({"type": "reply", "id": 1, "ok": False, "error": "boom"}, "reply.error: Input should be a valid dict"),
]


def test_a_forged_frame_from_a_runner_gets_it_killed_and_restarted_saying_why(tmp_path):
    with config.override(plugins={"restart_backoff_seconds": 0.05, "max_restarts": 10}):
        host = load_ipc_plugins(tmp_path / "plugins", "forger")
        try:
            record = host.records[FORGER]
            tools = {c.name: c for c in record.components}
            # A declaration that is not one costs that component, never the load.
            assert record.state == PluginState.LOADED and tools["forge"].registered and tools["ping"].registered
            assert not tools["bogus"].registered
            assert tools["bogus"].note == "not registered: AttributeError: 'str' object has no attribute 'get'"
            for n, (frame, why) in enumerate(FORGED, 1):
                pid = record.runner_pid
                with pytest.raises(RunnerGone, match="was killed: malformed frame from the runner"):
                    host.invoke(record, tools["forge"], {"frame": json.dumps(frame)}, 20)
                assert wait_for(
                    lambda pid=pid: record.runner_state == "running" and record.runner_pid not in (None, pid),
                    timeout=30,
                ), record.recent_errors
                assert record.restarts == n and record.state == PluginState.LOADED
                assert any(
                    f"(pid {pid}) was killed: malformed frame from the runner: " in e and why in e
                    for e in record.recent_errors
                ), record.recent_errors
            assert host.invoke(record, tools["ping"], {}, 20) == {"content": "pong"}  # the host goes on
        finally:
            host.stop()


def _send(proc: subprocess.Popen, message: dict) -> None:
    ipc.write_all(proc.stdin, ipc.encode(message))


def test_a_malformed_frame_from_the_host_is_answered_with_the_error_and_the_runner_serves_on(tmp_path):
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(PROJECT_ROOT)}
    dirs = ["--data-dir", str(tmp_path / "data"), "--runtime-dir", str(tmp_path / "runtime")]
    proc = subprocess.Popen(
        [sys.executable, "-m", "plugins.runner", str(IPC_FIXTURES / "forger"), FORGER, *dirs],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env=env,
    )
    try:
        assert protocol.from_runner(ipc.read_frame(proc.stdout)).type == "hello"
        malformed = [
            ({"type": "invoke", "id": 7, "component": 5}, "invoke.component: Input should be a valid string"),
            ({"type": "explode", "id": 8}, "Input tag 'explode' found using 'type' does not match"),
            ({"type": "load", "id": 9, "config_text": None, "exec": "rm -rf /"}, "load.exec: Extra inputs"),
        ]
        for frame, why in malformed:
            _send(proc, frame)
            reply = protocol.from_runner(ipc.read_frame(proc.stdout))
            assert isinstance(reply, protocol.Reply) and reply.id == frame["id"] and not reply.ok
            assert reply.error["type"] == "ProtocolError"
            message = reply.error["message"]
            assert message.startswith("malformed frame from the host: ") and why in message
        _send(proc, {"type": "cancel"})  # names no request: logged, not answered
        _send(proc, protocol.Cancel(id=99).wire())
        assert protocol.from_runner(ipc.read_frame(proc.stdout)) == protocol.Cancelled(id=99)
        _send(proc, protocol.Unload(id=10).wire())
        assert protocol.from_runner(ipc.read_frame(proc.stdout)) == protocol.Reply(id=10, ok=True)
        assert proc.wait(20) == 0
        assert b"malformed frame from the host: cancel.id: Field required" in proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            stream.close()
