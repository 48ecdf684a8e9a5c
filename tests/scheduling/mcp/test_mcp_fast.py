"""MCP without servers: the [[mcp.servers]] config, the registry's comings and goings and the admin pages
(the endpoint's tool calls in-process: tests/api/test_mcp_endpoint.py)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from api.access import api_token_create
from api.models import McpEndpointCall
from chat.components import Tool, registry
from core import reload
from core.config import ConfigError, get_config, mcp_secret_resolve, parse_config
from scheduling.mcp.client import offered_name
from scheduling.mcp.models import McpServerState
from tests.console import test_console_config_editor as editor_tests
from tests.console.test_console_config_editor import form_data

# The config editor's fixtures: a config file of the test's own, a superuser, staff with change_config only.
config_file, operator, config_editor = editor_tests.config_file, editor_tests.operator, editor_tests.config_editor


@pytest.mark.parametrize(
    ("toml", "problem"),
    [
        ('[[mcp.servers]]\nname = "a"\n', "give exactly one of command (stdio) or url (streamable HTTP)"),
        ('[[mcp.servers]]\nname = "a"\ncommand = "x"\nurl = "http://h/mcp"\n', "give exactly one of command"),
        ('[[mcp.servers]]\nname = "Bad-Name"\ncommand = "x"\n', "mcp.servers.0.name"),
        ('[[mcp.servers]]\nname = "a"\nurl = "ftp://h"\n', "mcp.servers.0.url"),
        ('[[mcp.servers]]\nname = "a"\ncommand = "x"\ncall_timeout_seconds = 1e9\n', "call_timeout_seconds"),
        ('[[mcp.servers]]\nname = "a"\ncommand = "x"\nscopes = ["everywhere"]\n', "mcp.servers.0.scopes.0"),
        ('[[mcp.servers]]\nname = "a"\ncommand = "x"\n[[mcp.servers]]\nname = "a"\ncommand = "y"\n', "repeated: a"),
    ],
)
def test_bad_server_entries_are_refused_naming_the_key(toml, problem):
    with pytest.raises(ConfigError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        parse_config(toml)


def test_secrets_come_only_from_the_variables_the_deployment_allows(monkeypatch):
    toml = '[[mcp.servers]]\nname = "a"\nurl = "http://h/mcp"\nheaders = {Authorization = "${%s}"}\n'
    with pytest.raises(ConfigError, match="'SECRET_KEY' is not an allowed secret variable"):
        parse_config(toml % "SECRET_KEY")
    monkeypatch.setenv("MAIBOT_MCP_SECRET_ENVS", "SEARCH_TOKEN")
    monkeypatch.setenv("SEARCH_TOKEN", "Bearer s3cret")
    entry = parse_config(toml % "SEARCH_TOKEN").mcp.servers[0]
    assert entry.headers == {"Authorization": "${SEARCH_TOKEN}"}  # the file and the editor keep the name
    assert mcp_secret_resolve(entry.headers["Authorization"]) == "Bearer s3cret"
    assert mcp_secret_resolve("plain ${NOT_A_REF") == "plain ${NOT_A_REF"


def test_a_server_entry_with_its_defaults():
    entry = parse_config('[[mcp.servers]]\nname = "calc"\ncommand = "python"\nargs = ["s.py"]\n').mcp.servers[0]
    assert (entry.tools, entry.scopes, entry.call_timeout_seconds, entry.enabled) == (["*"], ["chat"], 30.0, True)


def test_offered_names_fit_what_the_model_accepts():
    assert offered_name("calc", "add") == "calc__add"
    assert offered_name("fs", "read.file/v2") == "fs__read_file_v2"
    assert len(offered_name("x", "t" * 100)) == 64


def test_tools_come_and_go_from_the_registry():
    tool = Tool(name="tmp__echo", description="", parameters={"type": "object"}, func=lambda ctx: {"ok": True})
    registry.register(tool)
    try:
        assert registry.get("tmp__echo") is tool
    finally:
        assert registry.unregister("tmp__echo")
    assert registry.get("tmp__echo") is None and not registry.unregister("tmp__echo")


@pytest.mark.django_db
def test_admin_pages_show_servers_and_endpoint_calls(admin_client):
    token, _ = api_token_create(name="agent")
    McpServerState.objects.create(
        name="calc",
        process="h:1",
        transport="stdio",
        state="down",
        tools=[],
        last_error="EOF",
        calls=4,
        total_call_ms=80,
    )
    McpEndpointCall.objects.create(
        token=token, tool="send_message", ok=False, error_code="missing_anchor", duration_ms=3
    )
    page = admin_client.get(reverse("admin:scheduling_mcpserverstate_changelist")).content.decode()
    assert "calc" in page and "Down (reconnecting)" in page and "20 ms" in page and "EOF" in page
    page = admin_client.get(reverse("admin:api_mcpendpointcall_changelist")).content.decode()
    assert "send_message" in page and "missing_anchor" in page and "agent" in page
    assert admin_client.get(reverse("admin:scheduling_mcpserverstate_add")).status_code == 403
    # The token's page leads to its calls.
    page = admin_client.get(reverse("admin:chat_apitoken_change", args=[token.pk])).content.decode()
    calls = reverse("admin:api_mcpendpointcall_changelist") + f"?token__id__exact={token.pk}"
    assert calls in page
    assert "missing_anchor" in admin_client.get(calls).content.decode()


# --- the config editor: the servers are written in the form's table or the TOML editor, only with their
# own permission ----

SERVER_TOML = '\n[[mcp.servers]]\nname = "calc"\ncommand = "python"\nargs = ["calc.py"]\ntools = ["add"]\n'


def test_a_config_editor_without_the_mcp_permission_cannot_change_the_servers(config_file, config_editor):
    client, _ = config_editor
    before = config_file.read_text(encoding="utf-8")
    row = {"mcp__servers-0-name": "calc", "mcp__servers-0-command": "python", "mcp__servers-0-args": "calc.py"}
    page = client.post("/admin/config/", form_data(client) | row).content.decode()
    assert "Can change the MCP servers" in page
    assert config_file.read_text(encoding="utf-8") == before and get_config().mcp.servers == []
    page = client.post(
        "/admin/config/raw/", {"toml": before + SERVER_TOML, "base_digest": reload.text_digest(before)}
    ).content.decode()
    assert "Can change the MCP servers" in page
    assert config_file.read_text(encoding="utf-8") == before and get_config().mcp.servers == []


def test_an_operator_writes_the_servers_and_the_form_keeps_them(config_file, operator):
    before = config_file.read_text(encoding="utf-8")
    response = operator.post(
        "/admin/config/raw/", {"toml": before + SERVER_TOML, "base_digest": reload.text_digest(before)}
    )
    assert response.status_code == 302
    (entry,) = get_config().mcp.servers
    assert (entry.name, entry.command, entry.args, entry.tools) == ("calc", "python", ["calc.py"], ["add"])
    # A form save of another key leaves the servers' tables as written.
    assert operator.post("/admin/config/", form_data(operator) | {"chat__max_rounds": "4"}).status_code == 302
    text = config_file.read_text(encoding="utf-8")
    assert SERVER_TOML in text and parse_config(text).mcp.servers == [entry]
