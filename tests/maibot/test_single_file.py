"""The single file's parts without building it: the data dir's version stamp and the refusal, the secrets file,
the set-up page's gate (the one-time code, always), the `maibot` command and the supervisor's children.
The built file itself is tested live in tests/maibot/test_pyz.py."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from core import __version__, datadir, deployment_env, setup
from core.config import get_config
from maibot import cli
from maibot.management.commands import serve

pytestmark = pytest.mark.django_db


@pytest.fixture
def data_dir(settings, tmp_path) -> Path:
    settings.DATA_DIR = tmp_path
    return tmp_path


# --- the version stamp --------------------------------------------------------------------------------


def test_a_fresh_data_dir_passes_and_is_stamped_with_this_version(data_dir):
    datadir.check_not_newer()
    datadir.write_stamp()
    stamp = json.loads((data_dir / datadir.STAMP_NAME).read_text())
    assert stamp["version"] == __version__ and stamp["migrated_at"].endswith("+00:00")
    datadir.check_not_newer()


def test_an_older_stamp_is_accepted(data_dir):
    (data_dir / datadir.STAMP_NAME).write_text(json.dumps({"version": "0.0.1"}))
    datadir.check_not_newer()


def test_a_newer_stamp_refuses_naming_both_versions(data_dir):
    (data_dir / datadir.STAMP_NAME).write_text(json.dumps({"version": "99.0.0"}))
    with pytest.raises(datadir.DataDirTooNew, match=rf"maibot 99\.0\.0; this is {__version__}"):
        datadir.check_not_newer()


def test_a_stamp_that_is_no_version_refuses(data_dir):
    (data_dir / datadir.STAMP_NAME).write_text(json.dumps({"version": "next"}))
    with pytest.raises(datadir.DataDirTooNew, match="'next'"):
        datadir.check_not_newer()


def test_a_migration_this_build_does_not_have_refuses(data_dir):
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO django_migrations (app, name, applied) VALUES ('chat', '9999_later', CURRENT_TIMESTAMP)"
        )
    with pytest.raises(datadir.DataDirTooNew, match=r"chat\.9999_later"):
        datadir.check_not_newer()


def test_bootstrap_refuses_a_newer_data_dir_before_migrating(data_dir):
    from django.core.management import CommandError, call_command

    (data_dir / datadir.STAMP_NAME).write_text(json.dumps({"version": "99.0.0"}))
    with pytest.raises(CommandError, match="Refusing to start"):
        call_command("bootstrap", "--setup-page")
    assert json.loads((data_dir / datadir.STAMP_NAME).read_text())["version"] == "99.0.0"


# --- deployment.env -----------------------------------------------------------------------------------


def test_the_secrets_file_is_private_merged_and_never_overrides_the_environment(tmp_path, monkeypatch):
    path = tmp_path / deployment_env.FILE_NAME
    deployment_env.update(path, {"OPENAI_API_KEY": "sk-1", "MAIBOT_ADAPTER_TOKENS": "tok"})
    deployment_env.update(path, {"MAIBOT_ADAPTER_TOKENS": ""})  # empty: removed
    assert path.stat().st_mode & 0o777 == 0o600
    assert deployment_env.read(path) == {"OPENAI_API_KEY": "sk-1"}

    path.write_text(path.read_text() + "DATABASE_URL=postgres://elsewhere\n")
    assert "DATABASE_URL" not in deployment_env.read(path)  # only the names it keeps
    monkeypatch.setenv("OPENAI_API_KEY", "from-the-environment")
    deployment_env.load_into_environ(path)
    assert os.environ["OPENAI_API_KEY"] == "from-the-environment"


def test_the_secrets_file_refuses_other_names_and_line_breaks_and_keeps_what_it_had(tmp_path):
    path = tmp_path / deployment_env.FILE_NAME
    deployment_env.update(path, {"OPENAI_API_KEY": "sk-1"})
    with pytest.raises(ValueError, match="SECRET_KEY"):
        deployment_env.update(path, {"SECRET_KEY": "x"})
    with pytest.raises(ValueError, match="one line"):
        deployment_env.update(path, {"OPENAI_API_KEY": "sk-2\nDATABASE_URL=x"})
    assert deployment_env.read(path) == {"OPENAI_API_KEY": "sk-1"}


# --- the set-up page ----------------------------------------------------------------------------------

FORM = {
    "username": "op",
    "password": "a-long-password-1",
    "password2": "a-long-password-1",
    "llm_base_url": "",
    "llm_api_key": "",
    "llm_model": "",
    "nickname": "Setty",
    "persona": "A careful helper.",
    "adapter_token": "tok-123",
}
FAR = {"REMOTE_ADDR": "203.0.113.9"}


@pytest.fixture
def pending(data_dir, settings) -> str:
    settings.MAIBOT_ADAPTER_TOKENS = ()
    return setup.issue_code()


def test_without_a_code_file_there_is_no_set_up_page(data_dir, client):
    assert client.get("/setup/").url == "/admin/"
    assert client.get("/admin/").url.startswith("/admin/login/")


def test_while_set_up_is_pending_pages_lead_to_it_and_the_api_and_health_do_not(pending, client):
    assert client.get("/admin/").url == "/setup/"
    assert client.get("/chat/").url == "/setup/"
    assert client.get("/healthz").status_code in (200, 503)
    page = client.get("/setup/")
    assert page.status_code == 200 and b'name="code"' in page.content  # loopback too: the code is asked


def test_from_another_machine_the_code_is_needed_and_a_wrong_one_creates_nothing(pending, client):
    page = client.get("/setup/", **FAR)
    assert b'name="code"' in page.content
    wrong = client.post("/setup/", {**FORM, "code": "guess"}, **FAR)
    assert wrong.status_code == 403 and b"not the code printed in the console" in wrong.content
    assert not get_user_model().objects.exists() and setup.setup_pending()
    assert client.post("/setup/test-model/", {"code": "guess"}, **FAR).status_code == 403


def test_finishing_set_up_creates_the_operator_saves_the_settings_and_closes_the_page(pending, client, data_dir):
    done = client.post("/setup/", {**FORM, "code": pending}, **FAR)
    assert done.url == "/"
    user = get_user_model().objects.get(username="op")
    assert user.is_superuser and client.get("/admin/").status_code == 200  # logged in
    assert not setup.setup_pending()
    assert get_config().bot.nickname == "Setty" and get_config().offline
    assert 'nickname = "Setty"' in (data_dir / "bot_config.toml").read_text()
    assert deployment_env.read(data_dir / deployment_env.FILE_NAME) == {"MAIBOT_ADAPTER_TOKENS": "qq:tok-123"}
    assert client.get("/setup/").url == "/admin/"


def test_set_up_asks_for_the_bots_language_and_time_zone_and_saves_them(pending, client, data_dir):
    page = client.get("/setup/", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "机器人使用的语言" in page and "机器人的时区" in page
    assert 'value="Asia/Shanghai"' in page and '<option value="zh" selected>中文</option>' in page
    assert '<datalist id="time-zones">' in page
    done = client.post("/setup/", {**FORM, "code": pending, "language": "en", "time_zone": "Europe/Berlin"}, **FAR)
    assert done.url == "/"
    text = (data_dir / "bot_config.toml").read_text()
    assert 'language = "en"' in text and 'time_zone = "Europe/Berlin"' in text
    assert get_config().tzinfo.key == "Europe/Berlin" and get_config().bot.language == "en"


def test_an_unknown_time_zone_is_refused_naming_it_and_nothing_is_made(pending, client, data_dir):
    before = (data_dir / "bot_config.toml").read_text() if (data_dir / "bot_config.toml").exists() else None
    for zone in ("Mars/Olympus_Mons", "../../etc/passwd", "北京"):
        page = client.post("/setup/", {**FORM, "code": pending, "time_zone": zone}, **FAR)
        assert page.status_code == 200 and "is no time zone this machine knows" in page.content.decode(), zone
    assert not get_user_model().objects.exists() and setup.setup_pending()
    after = (data_dir / "bot_config.toml").read_text() if (data_dir / "bot_config.toml").exists() else None
    assert after == before


def test_set_up_refuses_bad_input_and_keeps_the_page_open(pending, client):
    bad = {**FORM, "code": pending, "password2": "other", "llm_model": "gpt", "adapter_token": "a,b"}
    page = client.post("/setup/", bad)
    text = page.content.decode()
    assert "The passwords differ." in text and "A model needs its API base URL." in text
    assert "One token, without commas or spaces." in text
    assert not get_user_model().objects.exists() and setup.setup_pending()


# --- the command and the supervisor ---------------------------------------------------------------------


def test_the_command_says_its_version_and_refuses_unknown_arguments(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"maibot {__version__}\n"
    assert cli.main(["frobnicate"]) == 2
    assert "unknown arguments" in capsys.readouterr().err


def test_the_cluster_runs_through_manage_py_in_the_repository_and_the_package_when_installed(settings, tmp_path):
    assert serve.manage_argv("qcluster") == [sys.executable, str(settings.BASE_DIR / "manage.py"), "qcluster"]
    settings.BASE_DIR = tmp_path  # an installed package: no manage.py beside the apps
    assert serve.manage_argv("qcluster") == [sys.executable, "-m", "maibot", "manage", "qcluster"]


def test_a_python_the_build_was_not_made_for_is_told_so_before_anything_starts(monkeypatch, capsys):
    assert cli.interpreter_problem() is None
    monkeypatch.setitem(sys.modules, "_cffi_backend", None)  # its import now fails as on another Python
    assert cli.main(["manage", "check"]) == 3
    err = capsys.readouterr().err
    assert f"do not load on Python {sys.version.split()[0]}" in err and "DIST_PYTHON" in err
