"""The single file, end to end, as the issue's new operator meets it: `make dist` builds dist/maibot.pyz once
per session; copied alone into an empty folder and run with the system python3 (not the project's venv)
bound to every address (HOST=0.0.0.0), it creates ./maibot-data and prints the set-up page's addresses;
opened from another machine (this machine's own non-loopback address: the server sees a remote client) in
headless Chromium set to Chinese, the set-up (operator, model with the test button, nickname, the bot's
language and time zone, the adapter on this machine without a token) shows the snippet for the NapCat
adapter; the adapter (tests.chat.napcat_standin: MaiBot-Napcat-Adapter 0.7 in legacy mode) configured with
exactly that snippet gets the bot's reply and, from the cluster's dispatcher, the message the bot
scheduled; the operator, in Chinese, opens the conversation's transcript, the scheduled message and the
model's spend from the sidebar. SIGTERM stops everything; started again after a migration was rolled back
and the stamp made older, it keeps the data and migrates, and the operator logs in from the same address;
on a data dir newer than itself (by the stamp, or by a migration it does not have) it refuses to start,
naming why."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from core import __version__
from tests.conftest import CHROMIUM_ARGS, ROOT, descendants, free_port, require_chromium, wait_for
from tests.fake_llm import FakeLLM

# The budget includes the session's one build (the fixture) and the first start's extraction.
pytestmark = [pytest.mark.live, pytest.mark.long, pytest.mark.browser, pytest.mark.timeout(420)]

OPERATOR, PASSWORD, TOKEN = "operator", "a-long-password-1", "pyz-adapter-token"


@pytest.fixture(scope="session")
def pyz(tmp_path_factory) -> Path:
    """dist/maibot.pyz, built once per session by `make dist`: with the uv that .ci/run installs when it
    is there (the same file, a third of the time), else with pip."""
    uv = ROOT / ".ci" / ".uv" / "bin" / "uv"
    command = ["make", "dist", *([f"UV={uv}"] if uv.exists() else [])]
    built = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    return ROOT / "dist" / "maibot.pyz"


def _system_python() -> str:
    """python3 from PATH, leaving out this virtual environment's bin (the file must not need the venv)."""
    venv_bin = str(Path(sys.prefix) / "bin")
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin)
    found = shutil.which("python3", path=path)
    assert found, "no python3 on PATH"
    prefix = subprocess.run([found, "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True).stdout
    assert Path(prefix.strip()).resolve() != Path(sys.prefix).resolve(), "python3 is the project's venv"
    return found


class Run:
    """`python3 maibot.pyz ARGS` in `folder`, with only the environment an operator would have."""

    def __init__(
        self, python: str, folder: Path, *args: str, port: int, shiv_root: Path, name: str, **extra: str
    ) -> None:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", str(folder)),
            "LANG": "C.UTF-8",
            "PORT": str(port),
            "SHIV_ROOT": str(shiv_root),
            **extra,
        }
        self.log = folder.parent / f"{name}.log"
        self._fh = self.log.open("wb")
        self.popen = subprocess.Popen(
            [python, "maibot.pyz", *args], cwd=folder, env=env, stdout=self._fh, stderr=subprocess.STDOUT
        )

    def output(self) -> str:
        if not self._fh.closed:
            self._fh.flush()
        return self.log.read_text(errors="replace")

    def wait_for_output(self, needle: str, timeout: float = 120) -> None:
        def seen() -> bool:
            if needle in self.output():
                return True
            assert self.popen.poll() is None, f"exited ({self.popen.returncode}):\n{self.output()}"
            return False

        assert wait_for(seen, timeout=timeout, interval=0.2), f"{needle!r} not seen:\n{self.output()}"

    def wait(self, timeout: float = 120) -> int:
        code = self.popen.wait(timeout=timeout)
        self._fh.close()
        return code

    def stop(self) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            return self.wait(timeout=60)
        finally:
            if self.popen.poll() is None:
                self.popen.kill()


def _answers(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def _set_up_in_browser(base: str, provider: FakeLLM, code: str) -> tuple[str, str]:
    """Fill in the set-up page, in a browser set to Chinese, with the printed one-time code, test the
    model, keep the adapter on this machine without a token (the default); returns what the test button
    showed and the adapter snippet the page showed."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=require_chromium(), args=CHROMIUM_ARGS, headless=True)
        page = browser.new_context(locale="zh-CN").new_page()
        page.set_default_timeout(30_000)
        page.goto(f"{base}/admin/")
        page.wait_for_url(f"{base}/setup/")  # the first page is the set-up page
        assert page.inner_text("h1") == "设置麦麦"
        page.fill("#id_code", code)
        page.fill("#id_username", OPERATOR)
        page.fill("#id_password", PASSWORD)
        page.fill("#id_password2", PASSWORD)
        page.fill("#id_llm_base_url", provider.base_url)
        page.fill("#id_llm_api_key", "sk-test")
        page.fill("#id_llm_model", "fake-1")
        page.fill("#id_nickname", "PyzBot")
        # The bot's language and time zone are asked, offered as the defaults (Chinese, Asia/Shanghai).
        assert page.input_value("#id_language") == "zh" and page.input_value("#id_time_zone") == "Asia/Shanghai"
        page.fill("#id_time_zone", "Asia/Hong_Kong")
        assert page.is_checked("#id_adapter_mode_0")  # the adapter on this machine, without a token
        snippet = page.inner_text("#snippet-local")
        page.click("#model-test")
        page.wait_for_selector("#model-test-result.warning")  # the fake answered without the tool call
        tested = page.inner_text("#model-test-result")
        page.click("#setup-submit")
        page.wait_for_url(f"{base}/admin/console/")  # the set-up lands on the dashboard
        assert OPERATOR.upper() in page.inner_text("#user-tools").upper()  # logged in as the new operator
        assert "仪表盘" in page.inner_text("#nav-sidebar")
        browser.close()
    return tested, snippet


async def _adapter_gets_reply_and_scheduled_message(snippet: str) -> list[str]:
    """The NapCat adapter configured with `snippet` (its config.toml's [maibot_server], legacy mode: it
    dials ws://host:port/ws, as MaiBot-Napcat-Adapter 0.7's mmc_com_layer does) passes a QQ user's
    message on; what its NapCat delivered: the bot's reply at once, then the message the bot scheduled,
    delivered by the cluster's dispatcher."""
    import tomllib

    from tests.chat.gateway_helpers import envelope
    from tests.chat.napcat_standin import NapCatStandIn
    from tests.conftest import wait_for_async

    server = tomllib.loads(snippet)["maibot_server"]
    adapter = await NapCatStandIn(f"http://{server['host']}:{server['port']}").start(timeout=30)
    try:
        frame = envelope(text="hello pyz, remind me in a moment", user_id=4242)
        assert await adapter.router.clients["qq"].send_message(frame)

        async def both() -> bool:
            texts = adapter.napcat.texts()
            return any("pong from the file" in t for t in texts) and any("scheduled from the file" in t for t in texts)

        await wait_for_async(both, timeout=90, what="the reply and the scheduled message at NapCat")
        return adapter.napcat.texts()
    finally:
        await adapter.stop()


def _console_shows_the_chat(base: str) -> None:
    """The operator, in Chinese, logs in and finds from the sidebar the conversation's transcript, the
    message the bot scheduled and the model's spend."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=require_chromium(), args=CHROMIUM_ARGS, headless=True)
        page = browser.new_context(locale="zh-CN").new_page()
        page.set_default_timeout(30_000)
        page.goto(f"{base}/admin/")  # the printed "operator console" address
        page.wait_for_url(f"{base}/admin/login/**")  # no set-up page any more: the normal login
        page.fill("#id_username", OPERATOR)
        page.fill("#id_password", PASSWORD)
        page.click("input[type=submit]")
        page.wait_for_url(f"{base}/admin/console/")  # lands on the dashboard
        usage = page.inner_text("#llm-usage")
        assert "LLM 用量" in usage and "fake-1" in usage, usage
        page.click("#console-chats a")  # the sidebar's Chats
        page.click("a.transcript-link")
        page.wait_for_url(f"{base}/admin/chats/*/")
        bubbles = page.locator(".bubble .text").all_inner_texts()
        assert bubbles[0] == "hello pyz, remind me in a moment" and "pong from the file" in bubbles, bubbles
        page.click("#console-scheduled a")  # the sidebar's Scheduled
        page.wait_for_url(f"{base}/admin/scheduling/scheduledmessage/")
        page.wait_for_selector("#result_list >> text=scheduled from the file")  # the list, once it has loaded
        browser.close()


def test_the_single_file_sets_up_in_the_browser_replies_stops_upgrades_and_refuses_newer_data(pyz, tmp_path):
    require_chromium()
    python = _system_python()
    folder = tmp_path / "empty"
    folder.mkdir()
    shutil.copy(pyz, folder / "maibot.pyz")
    shiv_root, data = tmp_path / "shiv", folder / "maibot-data"

    version = subprocess.run(
        [python, "maibot.pyz", "--version"],
        cwd=folder,
        capture_output=True,
        text=True,
        env={
            "PATH": os.environ["PATH"],
            "SHIV_ROOT": str(shiv_root),
            "HOME": str(tmp_path),
            "PYTHONDONTWRITEBYTECODE": "1",
        },
    )
    assert version.stdout.strip() == f"maibot {__version__}", version
    # The first start of the build unpacks it, saying how far it is, and compiles every module once (also
    # those it did not import, whatever PYTHONDONTWRITEBYTECODE says).
    assert "first start of this build: unpacking" in version.stderr, version.stderr
    assert "unpacked 100 %" in version.stderr and "compiled 100 %" in version.stderr, version.stderr
    (extraction,) = shiv_root.glob("maibot.pyz_*/site-packages")
    assert list((extraction / "django" / "__pycache__").glob("__init__.cpython-*.pyc")), "no bytecode in the extraction"
    assert list((extraction / "maibot" / "__pycache__").glob("cli.cpython-*.pyc")), "no bytecode in the extraction"

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with FakeLLM() as provider:
        # As in many Dockerfiles: the file still keeps its bytecode (compiled once, into its extraction).
        run = Run(
            python, folder, port=port, shiv_root=shiv_root, name="first", PYTHONDONTWRITEBYTECODE="1", HOST="0.0.0.0"
        )
        try:
            run.wait_for_output("one-time code:")
            first_start = run.output()
            # --version above unpacked the file already; this start found it so and says nothing of it.
            assert "unpacking" not in first_start, first_start
            assert re.search(r"Preparing the data dir: \d+ migrations to apply", first_start), first_start
            assert "migrated 100 %" in first_start, first_start
            run.wait_for_output(f"operator console: {base}/admin/")
            assert wait_for(lambda: _answers(f"{base}/healthz") == 200, timeout=90), run.output()
            assert sorted(p.name for p in folder.iterdir()) == ["maibot-data", "maibot.pyz"]

            code = re.search(r"one-time code: (\S+)", run.output()).group(1)
            # Bound to every address, it prints each address a browser can open, never 0.0.0.0; the operator
            # opens one that is not loopback, as from another machine.
            pages = re.findall(r"set-up page: +(\S+)", run.output())
            assert pages[0] == f"{base}/setup/" and "0.0.0.0" not in run.output(), run.output()
            remote = next((u.removesuffix("/setup/") for u in pages if "127.0.0.1" not in u), None)
            assert remote, f"this machine has no address but loopback (the walkthrough needs one): {pages}"
            tested, snippet = _set_up_in_browser(remote, provider, code)
            # The outcome only, never the model's words (the fake answers "ok" without the tool call).
            assert tested.startswith("警告：模型在") and "没有调用提供的工具" in tested, tested
            assert not (data / "setup-code").exists()
            assert (data / "deployment.env").stat().st_mode & 0o077 == 0
            assert 'nickname = "PyzBot"' in (data / "bot_config.toml").read_text()
            assert 'time_zone = "Asia/Hong_Kong"' in (data / "bot_config.toml").read_text()

            # The set-up's key reaches every process by the data dir's deployment.env, which each reads as it
            # changes: nothing is restarted for it.

            send_at = (datetime.now(UTC) + timedelta(seconds=8)).replace(microsecond=0).isoformat()
            provider.script(
                provider.tool_call(
                    "schedule_private_message", {"send_at": send_at, "message_text": "scheduled from the file"}
                ),
                provider.tool_call("reply", {"text": "pong from the file"}),
            )
            assert snippet == f'[maibot_server]\nhost = "127.0.0.1"\nport = {port}', snippet
            delivered = asyncio.run(_adapter_gets_reply_and_scheduled_message(snippet))
            assert len(delivered) == 2, delivered  # the reply and the scheduled message, once each
            # daphne, the cluster, its workers, monitor and pusher
            assert wait_for(lambda: len(descendants(run.popen.pid)) >= 5, timeout=60), descendants(run.popen.pid)
            started = descendants(run.popen.pid)
            assert run.output().count("dispatcher started") == 1, "the cluster was restarted"
        finally:
            code = run.stop()
        assert code == 0, run.output()
        assert "maibot stopped" in run.output()
        assert not [pid for pid in started if Path(f"/proc/{pid}").exists()], "processes outlived SIGTERM"

        # Upgrade: the data as an older build left it (one migration behind, an older stamp).
        rollback = subprocess.run(
            [python, "maibot.pyz", "manage", "migrate", "maibot", "0002"],
            cwd=folder,
            capture_output=True,
            text=True,
            env={"PATH": os.environ["PATH"], "SHIV_ROOT": str(shiv_root), "HOME": str(tmp_path)},
        )
        assert rollback.returncode == 0, rollback.stdout + rollback.stderr
        (data / "maibot-version.json").write_text(json.dumps({"version": "0.0.1"}))
        again = Run(python, folder, port=port, shiv_root=shiv_root, name="upgrade", HOST="0.0.0.0")
        try:
            again.wait_for_output("operator console:")
            assert "unpacking" not in again.output(), "the extraction was not reused"
            assert re.search(r"Preparing the data dir: \d+ migrations? to apply", again.output()), again.output()
            assert "migrated 100 %" in again.output(), again.output()
            assert wait_for(lambda: _answers(f"{base}/healthz") == 200, timeout=90), again.output()
            assert "one-time code" not in again.output()
            _console_shows_the_chat(remote)  # the address the set-up was opened at is still answered
        finally:
            assert again.stop() == 0, again.output()
        assert json.loads((data / "maibot-version.json").read_text())["version"] == __version__
        with sqlite3.connect(data / "db.sqlite3") as db:
            assert db.execute("SELECT 1 FROM django_migrations WHERE app = 'maibot' AND name LIKE '0003%'").fetchone()

    # Refusal: a newer build's stamp …
    (data / "maibot-version.json").write_text(json.dumps({"version": "999.0.0"}))
    newer = Run(python, folder, port=port, shiv_root=shiv_root, name="refused-stamp")
    assert newer.wait() == 1
    assert "Refusing to start" in newer.output() and "maibot 999.0.0" in newer.output(), newer.output()
    assert _answers(f"{base}/healthz") is None
    # … or a migration this build does not have.
    (data / "maibot-version.json").write_text(json.dumps({"version": __version__}))
    with sqlite3.connect(data / "db.sqlite3") as db:
        db.execute(
            "INSERT INTO django_migrations (app, name, applied) VALUES ('chat', '9999_from_the_future', '2030-01-01')"
        )
    newer = Run(python, folder, port=port, shiv_root=shiv_root, name="refused-migration")
    assert newer.wait() == 1
    assert "chat.9999_from_the_future" in newer.output(), newer.output()
