"""The config editors never show a secret, by key or by value, to a staff user with `change_config` only
(issue #25: the raw editor showed MCP headers and env literally), and a save keeps the real values: a
placeholder left where it was gets its secret back; one moved elsewhere (to read it there) is refused,
nothing written. Attacked through the Django test client, as that user. A model key or adapter token an
operator replaced in the console since the server started stays hidden the same way (with the plugins'
config.get)."""

from __future__ import annotations

import asyncio
import hashlib
import html
import json
import os
import re

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from core import config, deployment_env, reload
from core.redaction import PLACEHOLDER
from plugins.capabilities import config as plugin_config
from tests.console.test_console_config_editor import form_data_from

pytestmark = pytest.mark.backend_independent

OPENAI_KEY = "sk-live-openai-0123456789"
FILE_KEY = "sk-from-deployment-file-777"
ADAPTER_TOKEN = "adapter-token-abcdef123"
MCP_ENV_VALUE = "mcp-env-secret-999999"
HEADER = "Bearer literal-header-secret-42"
ENV_LITERAL = "literal-env-secret-43"
SHORT = "abc"  # too short to look for elsewhere; still hidden at its own place
SECRETS = [OPENAI_KEY, FILE_KEY, ADAPTER_TOKEN, MCP_ENV_VALUE, HEADER, "literal-header-secret-42", ENV_LITERAL]

TEXT = f"""# Our key is {OPENAI_KEY}: keep it safe
[bot]
nickname = "Mai"
persona = "You are Mai. (debug: {OPENAI_KEY})"
alias_names = ["Mai", "{ADAPTER_TOKEN}"]

[[mcp.servers]]
name = "search"
url = "https://mcp.example/search"
headers = {{ Authorization = "{HEADER}", X-Short = "{SHORT}", X-Ref = "${{MCP_SEARCH_KEY}}" }}

[[mcp.servers]]
name = "files"
command = "mcp-files"
env = {{ FILES_TOKEN = "{ENV_LITERAL}", FILES_KEY = "{MCP_ENV_VALUE}" }}
"""


@pytest.fixture
def secret_config(settings, tmp_path, monkeypatch):
    """A data dir whose config holds secrets in every form, that config in force. The server's environment
    sets the model key, the adapter tokens and an MCP secret; deployment.env holds another model key."""
    settings.DATA_DIR = tmp_path
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    monkeypatch.setenv("MAIBOT_ADAPTER_TOKENS", f"qq:{ADAPTER_TOKEN}")
    monkeypatch.setenv("MAIBOT_MCP_SECRET_ENVS", "MCP_SEARCH_KEY")
    monkeypatch.setenv("MCP_SEARCH_KEY", MCP_ENV_VALUE)
    # The server started with that environment (what it sets is the environment's: deployment.env's live
    # refresh never overrides it), and deployment.env was written after: the first page applies it.
    monkeypatch.setattr(deployment_env, "_from_environment", set())
    deployment_env.load_into_environ(tmp_path / deployment_env.FILE_NAME)
    deployment_env.update(tmp_path / deployment_env.FILE_NAME, {"OPENAI_API_KEY": FILE_KEY})
    path = tmp_path / "bot_config.toml"
    path.write_text(TEXT, encoding="utf-8")
    config.set_config(config.parse_config(TEXT))
    reload._applied_digest = None
    reload.last_error = reload.last_result = None
    yield path
    reload.last_error = reload.last_result = None


def _staff(*codenames: str, username: str = "editor") -> Client:
    user = User.objects.create_user(username, password="pw-123456", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def editor(db) -> Client:
    """The attacker of the issue: staff with change_config only (not the MCP or provider permissions)."""
    return _staff("view_console", "change_config")


def _leaks(page: str) -> list[str]:
    text = html.unescape(page)
    return [s for s in SECRETS if s in text]


def _raw_text(client: Client) -> tuple[str, str]:
    data = form_data_from(client.get("/admin/config/raw/").content.decode())
    return data["toml"], data["base_digest"]


def test_the_raw_editor_shows_no_secret_anywhere_in_the_text(editor, secret_config):
    page = editor.get("/admin/config/raw/").content.decode()
    assert _leaks(page) == []
    shown, digest = _raw_text(editor)
    assert os.environ["OPENAI_API_KEY"] == OPENAI_KEY  # deployment.env, applied by now, did not override it
    assert digest != hashlib.sha256(TEXT.encode()).hexdigest()  # no plain hash to test guesses against
    assert 'X-Short = "<redacted:' in shown  # short, but at a secret place
    assert 'X-Ref = "${MCP_SEARCH_KEY}"' in shown  # a reference names a secret, it is none
    assert shown.startswith("# Our key is <redacted:")  # comments too
    assert 'persona = "You are Mai. (debug: <redacted:' in shown  # inside a value under any key
    assert 'nickname = "Mai"' in shown and 'url = "https://mcp.example/search"' in shown


def test_the_form_shows_no_secret_in_fields_or_their_hidden_initial_values(editor, secret_config):
    page = editor.get("/admin/config/").content.decode()
    assert _leaks(page) == []
    assert PLACEHOLDER.search(form_data_from(page)["bot__alias_names"])


def test_saving_the_redacted_text_keeps_every_secret_and_applies_the_change(editor, secret_config):
    shown, digest = _raw_text(editor)
    edited = shown.replace('nickname = "Mai"', 'nickname = "Mai 2"')
    response = editor.post("/admin/config/raw/", {"toml": edited, "base_digest": digest})
    assert response.status_code == 302, html.unescape(response.content.decode())[-3000:]
    assert secret_config.read_text() == TEXT.replace('nickname = "Mai"', 'nickname = "Mai 2"')
    cfg = config.get_config()
    assert cfg.bot.nickname == "Mai 2" and cfg.mcp.servers[0].headers["Authorization"] == HEADER


@pytest.mark.parametrize(
    "move",
    [
        ("bot.nickname", lambda shown, ph: shown.replace('nickname = "Mai"', f'nickname = "{ph}"')),
        ("bot.alias_names[0]", lambda shown, ph: shown.replace('["Mai",', f'["{ph}",')),
        ("mcp.servers[1].command", lambda shown, ph: shown.replace('"mcp-files"', f'"{ph}"')),
    ],
    ids=["nickname", "alias", "other-field"],
)
def test_a_placeholder_moved_elsewhere_is_refused_and_nothing_is_written(editor, secret_config, move):
    where, edit = move
    shown, digest = _raw_text(editor)
    header = PLACEHOLDER.search(shown.split("Authorization = ", 1)[1])[0]
    response = editor.post("/admin/config/raw/", {"toml": edit(shown, header), "base_digest": digest})
    page = html.unescape(response.content.decode())
    assert response.status_code == 200 and f"{where}: a redacted value can only stay where it was" in page
    assert secret_config.read_text() == TEXT and config.get_config().bot.nickname == "Mai"
    assert _leaks(page) == []


def test_a_placeholder_in_a_key_is_refused(editor, secret_config):
    shown, digest = _raw_text(editor)
    token = PLACEHOLDER.search(shown.split("alias_names", 1)[1])[0]
    edited = shown.replace("[bot]\n", f'[bot]\nplatform_accounts = {{ "{token}" = "1" }}\n')
    page = html.unescape(editor.post("/admin/config/raw/", {"toml": edited, "base_digest": digest}).content.decode())
    assert "a key holds a redacted value" in page and secret_config.read_text() == TEXT


def test_the_form_keeps_secrets_of_untouched_fields_and_restores_them_in_edited_ones(editor, secret_config):
    data = form_data_from(editor.get("/admin/config/").content.decode())
    persona = data["bot__persona"]
    data.update(bot__nickname="Mai 3", bot__persona=persona.replace("You are Mai.", "You are Mai 3."))
    response = editor.post("/admin/config/", data)
    assert response.status_code == 302, html.unescape(response.content.decode())[-3000:]
    cfg = config.get_config()
    assert cfg.bot.nickname == "Mai 3" and cfg.bot.persona == f"You are Mai 3. (debug: {OPENAI_KEY})"
    assert cfg.bot.alias_names == ["Mai", ADAPTER_TOKEN]
    after = secret_config.read_text()
    assert HEADER in after and ENV_LITERAL in after and f"# Our key is {OPENAI_KEY}" in after


def test_the_form_refuses_a_placeholder_copied_into_another_field(editor, secret_config):
    data = form_data_from(editor.get("/admin/config/").content.decode())
    token = PLACEHOLDER.search(data["bot__alias_names"])[0]
    data["bot__nickname"] = token
    page = html.unescape(editor.post("/admin/config/", data).content.decode())
    assert "a redacted value can only stay where it was" in page
    assert secret_config.read_text() == TEXT and config.get_config().bot.nickname == "Mai"


def test_an_mcp_editor_replaces_a_secret_and_reordered_servers_keep_theirs(db, secret_config):
    client = _staff("view_console", "change_config", "change_mcp_servers")
    shown, digest = _raw_text(client)
    search, files = shown.split("[[mcp.servers]]")[1:]
    edited = shown.split("[[mcp.servers]]")[0] + "[[mcp.servers]]" + files.rstrip("\n") + "\n\n[[mcp.servers]]" + search
    edited = re.sub(r'FILES_TOKEN = "<redacted:[0-9a-f]+>"', 'FILES_TOKEN = "new-typed-value"', edited)
    response = client.post("/admin/config/raw/", {"toml": edited, "base_digest": digest})
    assert response.status_code == 302, html.unescape(response.content.decode())[-3000:]
    servers = {s.name: s for s in config.get_config().mcp.servers}
    assert [s.name for s in config.get_config().mcp.servers] == ["files", "search"]
    assert servers["search"].headers == {"Authorization": HEADER, "X-Short": SHORT, "X-Ref": "${MCP_SEARCH_KEY}"}
    assert servers["files"].env["FILES_KEY"] == MCP_ENV_VALUE
    assert servers["files"].env["FILES_TOKEN"] == "new-typed-value"


# --- secrets replaced live: what the process held once stays hidden ------------------------------------

OLD_KEY = "sk-retired-model-key-2468"
OLD_TOKEN = "retired-adapter-token-1357"
NEW_KEY = "sk-new-model-key-97531"
HAND_KEY = "sk-typed-by-hand-86420"
RETIRED_TEXT = f"""# Model key (until we rotate it): {OLD_KEY}
[bot]
nickname = "Mai"
persona = "You are Mai. (debug: {OLD_KEY})"
alias_names = ["Mai", "{OLD_TOKEN}"]

[[mcp.servers]]
name = "search"
url = "https://mcp.example/search"
headers = {{ Authorization = "Bearer {OLD_TOKEN}" }}
"""


@pytest.fixture
def retired(settings, tmp_path, monkeypatch):
    """A server started with deployment.env holding the model key and qq's token (none from the
    environment), and a config that repeats both; then an operator with manage_secrets replaces the key
    and rotates the token through the connect page's endpoint. Yields the values in force now."""
    settings.DATA_DIR = tmp_path
    for name in ("OPENAI_API_KEY", "MAIBOT_ADAPTER_TOKENS", "MAIBOT_LLM_KEY_ENVS", "MAIBOT_MCP_SECRET_ENVS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(deployment_env, "_from_environment", set())
    env_file = tmp_path / deployment_env.FILE_NAME
    deployment_env.update(env_file, {"OPENAI_API_KEY": OLD_KEY, "MAIBOT_ADAPTER_TOKENS": f"qq:{OLD_TOKEN}"})
    deployment_env.load_into_environ(env_file)
    (tmp_path / "bot_config.toml").write_text(RETIRED_TEXT, encoding="utf-8")
    config.set_config(config.parse_config(RETIRED_TEXT))
    reload._applied_digest = None
    reload.last_error = reload.last_result = None

    operator = _staff("view_console", "manage_secrets", username="operator")
    secret = "/admin/connect/secret/"
    assert operator.post(secret, {"action": "set", "secret": "model:OPENAI_API_KEY", "value": NEW_KEY}).json()["ok"]
    new_token = operator.post(secret, {"action": "rotate", "secret": "adapter:qq"}).json()["value"]
    # The old values are gone from the process and from the file: the config text alone still holds them.
    assert os.environ["OPENAI_API_KEY"] == NEW_KEY and os.environ["MAIBOT_ADAPTER_TOKENS"] == f"qq:{new_token}"
    assert deployment_env.read(env_file) == {"OPENAI_API_KEY": NEW_KEY, "MAIBOT_ADAPTER_TOKENS": f"qq:{new_token}"}
    yield tmp_path, [OLD_KEY, OLD_TOKEN, NEW_KEY, new_token]
    reload.last_error = reload.last_result = None


def _retired_leaks(page: str, secrets: list[str]) -> list[str]:
    text = html.unescape(page)
    return [s for s in secrets if s in text]


def test_a_key_and_token_replaced_in_the_console_stay_hidden_from_the_editors_and_plugins(editor, retired):
    data_dir, secrets = retired
    raw = editor.get("/admin/config/raw/").content.decode()
    assert _retired_leaks(raw, secrets) == []
    shown, digest = _raw_text(editor)
    assert shown.startswith("# Model key (until we rotate it): <redacted:")
    assert 'persona = "You are Mai. (debug: <redacted:' in shown and '["Mai", "<redacted:' in shown
    assert _retired_leaks(editor.get("/admin/config/").content.decode(), secrets) == []
    # A plugin's config.get: by value under any key.
    found = {key: asyncio.run(plugin_config.get(None, {"key": key}))["value"] for key in ("bot", "mcp")}
    assert _retired_leaks(json.dumps(found), secrets) == []
    assert found["bot"]["persona"] == "You are Mai. (debug: <redacted>)"
    assert found["bot"]["alias_names"] == ["Mai", "<redacted>"]

    # Saving the redacted text keeps the retired values where they were; moving one elsewhere is refused.
    old_key = PLACEHOLDER.search(shown)[0]
    moved = shown.replace('nickname = "Mai"', f'nickname = "{old_key}"')
    page = html.unescape(editor.post("/admin/config/raw/", {"toml": moved, "base_digest": digest}).content.decode())
    assert "bot.nickname: a redacted value can only stay where it was" in page
    assert _retired_leaks(page, secrets) == []
    edited = shown.replace('nickname = "Mai"', 'nickname = "Mai 2"')
    response = editor.post("/admin/config/raw/", {"toml": edited, "base_digest": digest})
    assert response.status_code == 302, html.unescape(response.content.decode())[-3000:]
    saved = RETIRED_TEXT.replace('nickname = "Mai"\n', 'nickname = "Mai 2"\n')
    assert (data_dir / "bot_config.toml").read_text() == saved
    assert config.get_config().bot.persona == f"You are Mai. (debug: {OLD_KEY})"

    # Remembered in memory only: no file of the data dir but the config itself holds a retired value.
    holders = {p.name for p in data_dir.rglob("*") if p.is_file() and OLD_KEY in p.read_text(errors="replace")}
    assert holders == {"bot_config.toml"}


def test_a_key_changed_by_hand_in_deployment_env_stays_hidden_once_applied(editor, retired):
    """Another process (or a hand edit) replaces the key the console set: this process applies the file
    on its next use of the key (deployment_env.refresh) and keeps hiding the key it replaced."""
    data_dir, secrets = retired
    (data_dir / "bot_config.toml").write_text(RETIRED_TEXT + f"# then: {NEW_KEY}\n", encoding="utf-8")
    deployment_env.update(data_dir / deployment_env.FILE_NAME, {"OPENAI_API_KEY": HAND_KEY})
    with config.override(llm={"model": "fake-model", "base_url": "http://127.0.0.1:9/v1"}):
        assert config.get_config().llm_models()["default"].api_key == HAND_KEY  # applied here, by refresh()
    raw = editor.get("/admin/config/raw/").content.decode()
    assert _retired_leaks(raw, [*secrets, HAND_KEY]) == []
    assert PLACEHOLDER.fullmatch(_raw_text(editor)[0].rsplit("# then: ", 1)[1].strip())
