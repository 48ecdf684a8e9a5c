"""A hostile plugin (tests/plugins/hostile_fixtures/config_snoop, written against the real
maibot-plugin-sdk, running in its runner) reads every section of the bot config through config.get: it
gets no secret, neither under a secret's key nor by value under an innocuous one (issue #25: MCP headers
and env came back literally, and pip_args), nor a key or token the operator replaced in the console since the
server started."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from core import config, deployment_env
from plugins.host import PluginHost, PluginState

pytestmark = pytest.mark.django_db(transaction=True)

SNOOP = "test.core.config-snoop"
FIXTURE = Path(__file__).resolve().parent / "hostile_fixtures" / "config_snoop"
OPENAI_KEY = "sk-live-openai-0123456789"
FILE_KEY = "sk-from-deployment-file-777"
ADAPTER_TOKEN = "adapter-token-abcdef123"
MCP_ENV_VALUE = "mcp-env-secret-999999"
HEADER = "Bearer literal-header-secret-42"
ENV_LITERAL = "literal-env-secret-43"
URL_PASSWORD = "url-password-31415"
URL = f"https://bot:{URL_PASSWORD}@mcp.example/s"
REFERENCE = "${MCP_SEARCH_KEY}"  # names a secret variable: not itself a secret
SECRETS = [OPENAI_KEY, FILE_KEY, ADAPTER_TOKEN, MCP_ENV_VALUE, "literal-header-secret-42", ENV_LITERAL, URL_PASSWORD]
SECRETS.append("abc")  # short: hidden at its own place only


@pytest.fixture
def snoop(tmp_path, settings, monkeypatch):
    settings.DATA_DIR = tmp_path
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    monkeypatch.setenv("MAIBOT_ADAPTER_TOKENS", f"qq:{ADAPTER_TOKEN}")
    monkeypatch.setenv("MAIBOT_MCP_SECRET_ENVS", "MCP_SEARCH_KEY")
    monkeypatch.setenv("MCP_SEARCH_KEY", MCP_ENV_VALUE)
    deployment_env.update(tmp_path / deployment_env.FILE_NAME, {"OPENAI_API_KEY": FILE_KEY})
    directory = tmp_path / "plugins"
    shutil.copytree(FIXTURE, directory / "config_snoop", ignore=shutil.ignore_patterns("__pycache__"))
    host = PluginHost()
    host.load_all(directory)
    record = host.records[SNOOP]
    assert record.state == PluginState.LOADED, record.reason
    yield host, record.context
    host.stop()


def test_a_hostile_plugin_reads_no_secret_through_config_get(snoop):
    host, ctx = snoop
    servers = [
        {"name": "search", "url": URL, "headers": {"Authorization": HEADER, "X-Short": "abc"}},
        {
            "name": "files",
            "command": "mcp-files",
            "env": {"T": ENV_LITERAL, "K": MCP_ENV_VALUE, "R": "${MCP_SEARCH_KEY}"},
        },
    ]
    with config.override(
        bot={"persona": f"You are Mai (debug {OPENAI_KEY}).", "alias_names": ["Mai", ADAPTER_TOKEN, FILE_KEY]},
        mcp={"servers": servers},
    ):
        found = host.run(ctx.api.call(f"{SNOOP}.snoop"), 30)
    dumped = json.dumps(found, ensure_ascii=False)
    assert [s for s in SECRETS if s in dumped] == []
    search, files = found["mcp.servers"]
    assert search["url"] == "https://bot:<redacted>@mcp.example/s"  # the rest of the URL reads as it is
    assert search["headers"] == {"Authorization": "<redacted>", "X-Short": "<redacted>"}
    assert files["env"] == {"T": "<redacted>", "K": "<redacted>", "R": REFERENCE}
    assert found["bot.persona"] == "You are Mai (debug <redacted>)."
    assert found["bot.alias_names"] == ["Mai", "<redacted>", "<redacted>"]
    assert found["bot"]["nickname"] == "麦麦"
    assert found["llm.api_key_env"] == found["plugins.pip_args"] == "(no answer)"


def test_a_key_and_token_replaced_in_the_console_stay_hidden_from_a_hostile_plugin(snoop, monkeypatch):
    host, ctx = snoop
    # The server started with deployment.env's key and token (none from its environment).
    for name in ("OPENAI_API_KEY", "MAIBOT_ADAPTER_TOKENS"):
        monkeypatch.delenv(name)
    monkeypatch.setattr(deployment_env, "_from_environment", set())
    env_file = deployment_env.default_path()
    deployment_env.update(env_file, {"MAIBOT_ADAPTER_TOKENS": f"qq:{ADAPTER_TOKEN}"})
    deployment_env.load_into_environ(env_file)
    # An operator with manage_secrets replaces both through the connect page.
    user = User.objects.create_user("operator", password="pw-123456", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=["view_console", "manage_secrets"]))
    operator = Client()
    operator.force_login(user)
    secret = "/admin/connect/secret/"
    new_key = "sk-new-model-key-97531"
    assert operator.post(secret, {"action": "set", "secret": "model:OPENAI_API_KEY", "value": new_key}).json()["ok"]
    new_token = operator.post(secret, {"action": "rotate", "secret": "adapter:qq"}).json()["value"]
    assert deployment_env.read(env_file) == {"OPENAI_API_KEY": new_key, "MAIBOT_ADAPTER_TOKENS": f"qq:{new_token}"}

    with config.override(bot={"persona": f"Mai (debug {FILE_KEY}).", "alias_names": ["Mai", ADAPTER_TOKEN, new_key]}):
        found = host.run(ctx.api.call(f"{SNOOP}.snoop"), 30)
    dumped = json.dumps(found, ensure_ascii=False)
    assert [s for s in (FILE_KEY, ADAPTER_TOKEN, new_key, new_token) if s in dumped] == []
    assert found["bot.persona"] == "Mai (debug <redacted>)."
    assert found["bot.alias_names"] == ["Mai", "<redacted>", "<redacted>"]
