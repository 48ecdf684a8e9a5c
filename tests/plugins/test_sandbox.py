"""A plugin runner is a security boundary: a hostile plugin written against the real maibot-plugin-sdk
(tests/plugins/hostile_fixtures/hostile), run by the real plugin host in its real sandbox (bubblewrap,
slirp4netns), tries what a malicious plugin would. Each claim of docs/plugins.md's "What a plugin can
and cannot do" is one test here: it reads none of the server's secrets and reaches no loopback service; every
process it starts dies with its runner; its processes, open files, file sizes, CPU time, sends and media
are bounded, each refusal told to the plugin and shown in the admin; its renders reach no local service.
The live test does it through a real server with real secrets in its environment and data dir."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from pathlib import Path

import pytest
from django.conf import settings

from chat.models import Direction, Message
from core import config
from plugins import sandbox
from plugins.host import PluginHost, PluginState
from tests.conftest import require_chromium, wait_for
from tests.plugins.conftest import copy_plugins

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.backend_independent]

HOSTILE = "test.maibot.hostile"
FIXTURE = Path(__file__).resolve().parent / "hostile_fixtures" / "hostile"
CONFIG = '[plugin]\nconfig_version = "1.0.0"\nenabled = true\n\n[hostile]\n'


@pytest.fixture
def hostile(tmp_path):
    """hostile(config="...", limits={...}, also=("weather",)) → a started PluginHost with the hostile
    plugin (its config.toml's [hostile] section given), its [[plugins.limits]] entry set; stopped after."""
    hosts: list[PluginHost] = []
    overrides = []

    def load(hostile_config: str = "", *, limits: dict | None = None, also: tuple[str, ...] = ()) -> PluginHost:
        directory = tmp_path / f"plugins-{len(hosts)}"
        shutil.copytree(FIXTURE, directory / "hostile", ignore=shutil.ignore_patterns("__pycache__"))
        (directory / "hostile" / "config.toml").write_text(CONFIG + hostile_config)
        copy_plugins(directory, *also) if also else None
        if limits is not None:
            override = config.override(plugins={"limits": [{"plugin": HOSTILE, **limits}]})
            override.__enter__()
            overrides.append(override)
        host = PluginHost()
        hosts.append(host)
        host.load_all(directory)
        record = host.records[HOSTILE]
        assert record.state == PluginState.LOADED, record.reason
        return host

    yield load
    for host in hosts:
        host.stop()
    for override in reversed(overrides):
        override.__exit__(None, None, None)


def invoke(host: PluginHost, tool: str, timeout: float = 60, **args) -> dict:
    record = host.records[HOSTILE]
    component = next(c for c in record.components if c.name == tool)
    return host.invoke(record, component, args, timeout)


def processes_with(marker: str) -> list[int]:
    """Host pids of the processes whose command line holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if marker.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def leaked(findings: dict, secrets: list[str]) -> list[str]:
    text = json.dumps(findings)
    return [s for s in secrets if s and s in text]


# --- secrets ------------------------------------------------------------------------------------------


def test_a_plugin_reads_no_secret_of_the_server_and_reaches_no_loopback_service(hostile, tmp_path):
    from django.contrib.sessions.backends.db import SessionStore

    data = Path(settings.DATA_DIR)
    session = SessionStore()
    session["who"] = "operator"
    session.create()  # a logged-in operator's session key, in the database
    marker = f"deployment-secret-{uuid.uuid4().hex}"
    created = [p for p in (data / "deployment.env", data / "secret_key") if not p.exists()]
    (data / "deployment.env").write_text(f"OPENAI_API_KEY={marker}\n") if data / "deployment.env" in created else None
    if data / "secret_key" in created:
        (data / "secret_key").write_text(f"secret-key-{uuid.uuid4().hex}")
    try:
        host = hostile()
        findings = invoke(host, "hostile_probe")
        secrets = [
            marker,
            session.session_key,
            (data / "secret_key").read_text().strip(),
            settings.SECRET_KEY,
            *(v for k, v in os.environ.items() if k in ("DATABASE_URL", "REDIS_URL", "OPENAI_API_KEY")),
        ]
        assert leaked(findings, secrets) == []
        read = sorted(path for path, text in findings["files"].items() if text.startswith("READ ") and "secret" in path)
        assert read == []
        assert [k for k, v in findings["files"].items() if "sqlite" in k and v.startswith("READ ")] == []
        # Its /proc shows its own sandbox only; its parent is the sandbox's init, not the server.
        assert os.getpid() not in findings["proc"]["pids"] or max(findings["proc"]["pids"]) < 100
        assert findings["proc"]["ppid"] == 1
        # No loopback service answers: PostgreSQL (trust on 127.0.0.1), Redis, PostgreSQL's unix socket.
        assert {k: v for k, v in findings["net"].items() if v.startswith("CONNECTED")} == {}
        # Nothing of the data dir is in its view, whatever path it takes.
        listed = {k: v for k, v in findings["files"].items() if k.startswith("listdir")}
        shown = " ".join(listed.values())
        assert not any(name in shown for name in ("secret_key", "deployment.env", "sqlite", "bot_config")), listed
        assert listed[f"listdir {data}"] == repr(["plugin-data", "plugin-runtime"])  # its own two dirs only
    finally:
        for path in created:
            path.unlink(missing_ok=True)


def test_a_plugin_cannot_write_into_its_own_folder_nor_past_its_file_and_open_file_limits(hostile):
    host = hostile(limits={"runner_max_file_mb": 2, "runner_max_open_files": 64})
    result = invoke(host, "hostile_files", big_mb=5)
    assert result["own_folder"].startswith("OSError: [Errno 30] Read-only file system"), result
    # The data/ beside the plugin folders is writable, and is the plugin's own data dir.
    assert result["plugins_data"] == "WROTE", result
    assert (Path(settings.DATA_DIR) / "plugin-data" / HOSTILE / "hostile" / "state.json").read_text() == "{}"
    assert not (host.records[HOSTILE].folder.parent / "data").exists()
    data_dir = str(Path(settings.DATA_DIR) / "plugin-data" / HOSTILE / "big.bin")
    assert result[data_dir].startswith("OSError after 2 MB: [Errno 27] File too large"), result
    assert result["/tmp/big.bin"].startswith("OSError after 2 MB"), result  # EFBIG or its small /tmp full
    count = int(result["open_files"].split()[-1])
    assert result["open_files"].startswith("OSError") and count < 64, result
    assert not (host.records[HOSTILE].folder / "planted.py").exists()


# --- processes ------------------------------------------------------------------------------------


def test_every_process_a_plugin_starts_dies_with_its_runner_on_reload_on_kill_and_on_stop(hostile):
    host = hostile()
    record = host.records[HOSTILE]
    heartbeat = Path(settings.DATA_DIR) / "plugin-data" / HOSTILE / "heartbeat"

    def daemon() -> str:
        heartbeat.unlink(missing_ok=True)
        marker = f"hostile-daemon-{uuid.uuid4().hex}"
        assert invoke(host, "hostile_daemon", marker=marker) == {"started": True}
        assert wait_for(lambda: heartbeat.exists() and processes_with(marker), timeout=20)
        return marker

    # A double-forked, setsid daemon outlives nothing: a reload (a new runner) ends it…
    marker = daemon()
    assert host.reload(HOSTILE).ok
    assert wait_for(lambda: not processes_with(marker), timeout=20), "the daemon survived a reload"
    # … so does a runner killed by the host (a stuck call, a limit)…
    marker = daemon()
    old = record.process
    old.kill("test")
    assert wait_for(lambda: not processes_with(marker), timeout=20), "the daemon survived its runner's kill"
    assert wait_for(lambda: record.runner_state == "running" and record.process is not old, timeout=30)
    # … and stopping the host (the server stopping).
    marker = daemon()
    host.stop()
    assert wait_for(lambda: not processes_with(marker), timeout=20), "the daemon survived the host"


def test_a_plugins_daemon_dies_when_its_folder_is_deleted(hostile):
    host = hostile()
    record = host.records[HOSTILE]
    heartbeat = Path(settings.DATA_DIR) / "plugin-data" / HOSTILE / "heartbeat"
    marker = f"hostile-daemon-{uuid.uuid4().hex}"
    assert invoke(host, "hostile_daemon", marker=marker) == {"started": True}
    assert wait_for(lambda: heartbeat.exists() and processes_with(marker), timeout=20)
    folder = record.folder
    shutil.rmtree(folder)
    assert host.remove_folder(folder).ok  # what the folder watcher does when it sees the folder gone
    assert record.state == PluginState.REMOVED
    assert wait_for(lambda: not processes_with(marker), timeout=20), "the daemon survived its plugin's deletion"


def test_a_plugin_forks_only_up_to_its_process_limit_and_other_plugins_keep_working(hostile, make_session):
    from chat.agent.engine import AgentTurn
    from chat.agent.llm import ToolCallRequest
    from chat.models import CycleKind

    host = hostile(limits={"runner_max_processes": 40}, also=("weather",))
    result = invoke(host, "hostile_fork")
    assert result["error"].startswith("BlockingIOError") and result["forked"] < 40, result
    # Its forks hold its process budget (each sleeps 30 s); another plugin's runner starts threads and
    # answers as ever.
    turn = AgentTurn.open(kind=CycleKind.CHAT, session=make_session(), trigger="test")
    request = ToolCallRequest(
        id="c1", name="get_weather", raw_arguments='{"city": "Paris"}', arguments={"city": "Paris"}
    )
    assert turn.execute([request])[0].result["result"]["content"] == "麦麦: light rain, 14°C"


def test_a_runner_past_its_cpu_limit_is_killed_and_the_admin_says_why(hostile, admin_client):
    from plugins import host as plugin_host

    host = hostile(limits={"runner_cpu_seconds_per_minute": 2})
    record = host.records[HOSTILE]
    first = record.process
    assert invoke(host, "hostile_spin") == {"spinning": True}
    assert wait_for(lambda: record.refusals.get("cpu") == 1, timeout=30), record.recent_errors
    assert first.kill_reason.startswith("it used ") and "runner_cpu_seconds_per_minute = 2" in first.kill_reason
    assert wait_for(lambda: record.runner_state == "running" and record.process is not first, timeout=30)
    assert any("was killed: it used" in e for e in record.recent_errors)
    plugin_host.host, previous = host, plugin_host.host
    try:
        page = admin_client.get("/admin/plugins/").content.decode()
    finally:
        plugin_host.host = previous
    assert "cpu: 1" in page and "runner_cpu_seconds_per_minute = 2" in page


# --- sends and media ------------------------------------------------------------------------------


def test_sends_and_media_past_a_plugins_budget_are_refused_to_it_and_shown_in_the_admin(
    hostile, make_session, admin_client
):
    from plugins import host as plugin_host

    session = make_session()
    host = hostile(limits={"sends_per_minute": 1000, "media_mb_per_minute": 1})
    record = host.records[HOSTILE]
    media = invoke(host, "hostile_media", stream_id=session.session_id, count=20, kb=300)
    assert media["sent"] == 3, media  # 3 × 300 kB within 1 MB a minute, the 4th refused
    assert "refused: plugin test.maibot.hostile may send 1 MB of media a minute" in media["error"]
    assert Message.objects.filter(direction=Direction.OUT, session=session).count() == 3

    with config.override(plugins={"limits": [{"plugin": HOSTILE, "sends_per_minute": 5}]}):
        spam = invoke(host, "hostile_spam", stream_id=session.session_id, count=50)
    assert spam["sent"] == 5, spam
    assert "refused: plugin test.maibot.hostile sent 5 messages within a minute" in spam["error"]
    assert Message.objects.filter(direction=Direction.OUT, session=session).count() == 3 + 5
    assert record.refusals == {"sends": 1, "media": 1}

    plugin_host.host, previous = host, plugin_host.host
    try:
        page = admin_client.get("/admin/plugins/").content.decode()
    finally:
        plugin_host.host = previous
    assert "Refused: media: 1, sends: 1" in page and "sent 5 messages within a minute" in page
    assert "bubblewrap" in page


# --- renders --------------------------------------------------------------------------------------


class Listener:
    """A TCP listener on 127.0.0.1 recording every connection (a WebSocket, a beacon, a fetch)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[bytes] = []
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.settimeout(2)
            try:
                self.accepted.append(conn.recv(4096))
            except OSError:
                self.accepted.append(b"")
            conn.close()

    def close(self) -> None:
        self.sock.close()


@pytest.mark.browser
@pytest.mark.parametrize("allow_network", [False, True])
def test_a_render_reaches_no_local_service_by_websocket_beacon_fetch_or_image(hostile, allow_network):
    require_chromium()
    listener = Listener()
    try:
        host = hostile()
        result = invoke(host, "hostile_render", port=listener.port, allow_network=allow_network)
        assert result == {"rendered": True, "error": ""}
        # The page ran its script for 1.5 s before the shot: time enough for any connection to land.
        assert listener.accepted == []
    finally:
        listener.close()


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")  # read by the view; no query runs here
@pytest.mark.parametrize("layout", ["data dir inside the project", "project inside the data dir", "database elsewhere"])
def test_the_view_hides_the_data_dir_and_the_database_however_they_lie(layout, tmp_path, settings):
    # The view shows the project (the runner's code) and hides the data dir and an SQLite database,
    # whichever contains the other; what the view needs within a hidden directory stays visible.
    project = tmp_path / "srv" / "app" if layout == "project inside the data dir" else tmp_path / "app"
    data = {"project inside the data dir": tmp_path / "srv", "data dir inside the project": project / "data"}.get(
        layout, tmp_path / "data"
    )
    for path in (project, data):
        path.mkdir(parents=True, exist_ok=True)
    tmp_path.chmod(0o755)  # readable by the sandbox's uid, as a deployment's directories are
    (project / "code.py").write_text("CODE")
    (data / "secret_key").write_text("SECRET-KEY")
    database = project / "db.sqlite3" if layout == "database elsewhere" else data / "db.sqlite3"
    database.write_text("SESSION-KEYS")
    settings.DATA_DIR, settings.MEDIA_ROOT = data, data / "media"
    settings.DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(database)}}
    script = f"cat {project}/code.py; cat {data}/secret_key; cat {database}; ls {data}; true"
    jail = sandbox.Jail.build(
        command=["/bin/sh", "-c", script],
        uid=sandbox.RENDER_UID,
        network="none",
        tmp_mb=1,
        visible=[tmp_path, project],  # a directory above both (as "/srv" in sys.path would be), and the code
    )
    try:
        done = subprocess.run(jail.argv, pass_fds=jail.pass_fds, capture_output=True, text=True, timeout=60)
    finally:
        jail.spawned()
    assert done.stdout.startswith("CODE"), done.stderr
    assert "SECRET-KEY" not in done.stdout and "SESSION-KEYS" not in done.stdout
    assert "secret_key" not in done.stdout


def test_a_runners_own_folders_are_reached_through_a_private_folder_that_holds_the_data_dir(tmp_path, settings):
    # The data dir inside a private (0700) folder of a visible tree (as parallel test workers' gwN in a
    # private MAIBOT_DATA_DIR): the runner's uid passes through it to its own data dir, and sees nothing
    # else of it.
    project = tmp_path / "app"
    private = project / "private"
    data = private / "data"
    own = data / "plugin-data" / "some.plugin"
    own.mkdir(parents=True)
    tmp_path.chmod(0o755)
    project.chmod(0o755)
    (private / "other-secret").write_text("OTHER-SECRET")
    private.chmod(0o700)
    settings.DATA_DIR, settings.MEDIA_ROOT = data, data / "media"
    script = f"echo written > {own}/note && cat {own}/note; ls {private}; cat {private}/other-secret; true"
    jail = sandbox.Jail.build(
        command=["/bin/sh", "-c", script],
        uid=sandbox.plugin_uid("some.plugin"),
        network="none",
        tmp_mb=1,
        visible=[project],
        own_rw=[own],
    )
    sandbox.prepare_dirs("some.plugin", own)
    try:
        done = subprocess.run(jail.argv, pass_fds=jail.pass_fds, capture_output=True, text=True, timeout=60)
    finally:
        jail.spawned()
    assert done.stdout.startswith("written"), done.stderr
    assert "OTHER-SECRET" not in done.stdout and "other-secret" not in done.stdout


def test_without_a_working_sandbox_plugins_are_refused_unless_the_deployment_opts_out(tmp_path, monkeypatch):
    copy_plugins(tmp_path / "plugins", "weather")
    monkeypatch.setattr(
        sandbox, "support", lambda: sandbox.Support("bwrap is not installed (apt-get install bubblewrap)")
    )
    host = PluginHost()
    try:
        host.load_all(tmp_path / "plugins")
        record = host.records["test.maibot.weather"]
        assert record.state == PluginState.REFUSED
        assert "the plugin sandbox cannot run: bwrap is not installed" in record.reason
        assert "MAIBOT_PLUGIN_SANDBOX=off" in record.reason
    finally:
        host.stop()
    monkeypatch.setattr(settings, "MAIBOT_PLUGIN_SANDBOX", "off")
    host = PluginHost()
    try:
        host.load_all(tmp_path / "plugins")
        record = host.records["test.maibot.weather"]
        assert record.state == PluginState.LOADED and record.sandbox.startswith("NOT SANDBOXED")
    finally:
        host.stop()


def test_a_server_that_is_not_root_sandboxes_its_plugins_in_a_user_namespace(tmp_path):
    # The real host, run as an unprivileged uid (in a view of this machine where the test's Python is
    # reachable: it may live under root's 0700 home), loads the hostile plugin from its own data dir.
    uid = 54321
    base = Path(tempfile.mkdtemp(prefix="maibot-unprivileged-", dir="/tmp"))
    try:
        data = base / "data"
        (data / "plugins").mkdir(parents=True)
        shutil.copytree(FIXTURE, data / "plugins" / "hostile", ignore=shutil.ignore_patterns("__pycache__"))
        for path in [base, *base.rglob("*")]:
            os.chown(path, uid, uid)
        view = ["bwrap", "--die-with-parent", "--dev-bind", "/", "/"]
        view += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]  # for setpriv
        for needed in {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)}:
            closed = next((a for a in reversed(Path(needed).parents) if not os.stat(a).st_mode & 0o001), None)
            if closed is not None:
                view += ["--tmpfs", str(closed)]
                for between in [p for p in reversed(Path(needed).parents) if p.is_relative_to(closed) and p != closed]:
                    view += ["--perms", "0755", "--dir", str(between)]
                view += ["--ro-bind", needed, needed]
        marker = f"hostile-daemon-{uuid.uuid4().hex}"
        env = {"PATH": "/usr/bin:/bin", "MAIBOT_DATA_DIR": str(data), "HOSTILE_MARKER": marker, "HOME": str(base)}
        script = Path(__file__).with_name("unprivileged_host.py")
        argv = [*view, "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", sys.executable, script]
        done = subprocess.run([str(a) for a in argv], env=env, capture_output=True, text=True, timeout=180)
        line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
        assert line is not None, done.stdout + done.stderr
        result = json.loads(line.removeprefix("RESULT "))
        assert result["uid"] == uid and result["state"] == "loaded", result["reason"] + done.stderr[-3000:]
        assert result["sandbox"].startswith("bubblewrap, the server's user in a user namespace"), result
        findings = result["findings"]
        assert leaked(findings, [result["secret_key"]]) == []
        assert [k for k, v in findings["files"].items() if v.startswith("READ ") and "secret" in k] == []
        assert {k: v for k, v in findings["net"].items() if v.startswith("CONNECTED")} == {}
        assert result["daemon_started"] and not result["daemon_left"], result
    finally:
        shutil.rmtree(base, ignore_errors=True)


# --- through a live server ------------------------------------------------------------------------


@pytest.mark.live
def test_through_a_live_server_a_plugin_reads_no_secret_and_its_daemon_dies_with_the_server(start_server, tmp_path):
    import urllib.error
    import urllib.request

    data = tmp_path / "data-web"
    key, token, stored = (f"{name}-{uuid.uuid4().hex}" for name in ("model-key", "adapter-token", "stored-key"))
    marker = f"hostile-daemon-{uuid.uuid4().hex}"
    (data / "plugins").mkdir(parents=True)
    shutil.copytree(FIXTURE, data / "plugins" / "hostile", ignore=shutil.ignore_patterns("__pycache__"))
    (data / "deployment.env").write_text(f"MAIBOT_LLM_MODEL={stored}\n")
    secret_key = f"server-secret-{uuid.uuid4().hex}"
    (data / "secret_key").write_text(secret_key)
    proc, base = start_server(OPENAI_API_KEY=key, MAIBOT_ADAPTER_TOKENS=token)
    port = int(base.rsplit(":", 1)[1])
    (data / "plugins" / "hostile" / "config.toml").write_text(
        CONFIG + f'probe_on_load = true\ndaemon_on_load = "{marker}"\nserver_port = {port}\n'
    )
    with contextlib.suppress(urllib.error.HTTPError):  # any answer: the plugins load on the first request
        urllib.request.urlopen(base + "/healthz", timeout=10).read()
    findings_file = data / "plugin-data" / HOSTILE / "findings.json"
    assert wait_for(findings_file.exists, timeout=60), proc.output()
    assert wait_for(lambda: processes_with(marker), timeout=30)
    findings = json.loads(findings_file.read_text())
    server_env = (Path(f"/proc/{proc.popen.pid}/environ").read_bytes()).decode()
    secrets = [key, token, stored, secret_key, *(v for v in server_env.split("\0") if v.startswith("sqlite"))]
    assert leaked(findings, secrets) == []
    assert {k: v for k, v in findings["net"].items() if v.startswith("CONNECTED")} == {}

    proc.popen.send_signal(signal.SIGKILL)  # the server dies without stopping anything
    assert wait_for(lambda: not processes_with(marker), timeout=20), "the daemon outlived the server"
