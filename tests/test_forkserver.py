"""The test workers' fork server (tests.forkserver): its children behave as plain child processes do."""

import os
import signal
import subprocess
import sys

import pytest

from tests import forkserver
from tests.conftest import ROOT, wait_for

pytestmark = [pytest.mark.live, pytest.mark.backend_independent]


def _shell(code: str) -> list[str]:
    return [sys.executable, "manage.py", "shell", "-c", code]


def test_a_forked_child_gets_its_env_session_output_and_exit_status(tmp_path):
    log = tmp_path / "child.log"
    log.touch()
    code = "import os, sys; print(os.environ['FS_PROBE'], os.getsid(0) == os.getpid(), flush=True); sys.exit(3)"
    env = {**os.environ, "FS_PROBE": "probe-值", "PYTHONUNBUFFERED": "1"}
    assert forkserver.usable(_shell(code))
    child = forkserver.spawn(_shell(code), env, str(log), str(ROOT))
    assert child.wait(timeout=60) == 3
    assert child.poll() == 3
    assert log.read_text().splitlines()[-1] == "probe-值 True"


def test_a_forked_child_ends_by_a_signal_as_a_plain_child_does(tmp_path):
    log = tmp_path / "child.log"
    log.touch()
    child = forkserver.spawn(
        _shell("import signal; print('up', flush=True); signal.pause()"), dict(os.environ), str(log), str(ROOT)
    )
    assert wait_for(lambda: "up" in log.read_text(), timeout=60)
    assert child.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(timeout=0.1)
    child.terminate()
    assert child.wait(timeout=30) == -signal.SIGTERM


def test_other_programs_are_not_forked():
    assert not forkserver.usable(["sh", "-c", "true"])
    assert not forkserver.usable([sys.executable, "-c", "pass"])
