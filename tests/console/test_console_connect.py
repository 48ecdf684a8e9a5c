"""The "Connect an adapter" page and the secrets on it, in process: the snippets carry this server's
addresses (a forged Host never), the adapters' state is served as JSON; a token or key is in no page and no
GET, only in the answer to a POST of a user with maibot.manage_secrets (CSRF-checked); a rotation and a new
model key apply to this process at once (the gateway's admission, the model calls), and every reveal and
change is in the config history without the value, and in no log line. (Across processes, against a real
adapter and the fake model server: test_console_connect_live.py; in Chromium:
test_console_connect_browser.py.)"""

from __future__ import annotations

import logging
from html import unescape

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import Permission, User
from django.test import Client

from chat.gateway.auth import adapter_auth_problem
from chat.models import AdapterConnection
from core import config, deployment_env
from core.models import ConfigChange

pytestmark = pytest.mark.django_db

TOKEN = "qq-token-that-must-stay-hidden"
KEY = "sk-model-key-that-must-stay-hidden"
URL, STATE, SECRET = "/admin/connect/", "/admin/connect/state/", "/admin/connect/secret/"


@pytest.fixture
def secrets_file(settings, tmp_path, monkeypatch, caplog):
    """A data dir whose deployment.env holds qq's token and the model key (none from the environment)."""
    caplog.set_level(logging.DEBUG)
    settings.DATA_DIR = tmp_path
    monkeypatch.setattr(deployment_env, "_from_environment", set())
    deployment_env.update(
        tmp_path / deployment_env.FILE_NAME, {"MAIBOT_ADAPTER_TOKENS": f"qq:{TOKEN}", "OPENAI_API_KEY": KEY}
    )
    deployment_env.refresh()
    with config.override(llm={"model": "fake-model", "base_url": "http://127.0.0.1:9/v1"}):
        yield tmp_path / deployment_env.FILE_NAME
    assert TOKEN not in caplog.text and KEY not in caplog.text


def auth(client_host: str, token: str | None) -> str | None:
    return adapter_auth_problem(platform="qq", token=token, client_host=client_host)


def staff(*perms: str, csrf: bool = False) -> Client:
    user = User.objects.create_user("staff", password="pw-123456", is_staff=True)
    for perm in perms:
        user.user_permissions.add(Permission.objects.get(codename=perm))
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


def no_secret_in(text: str, *more: str) -> None:
    for secret in (TOKEN, KEY, *more):
        assert secret not in text


def test_the_page_shows_each_way_with_this_servers_address_and_no_secret(secrets_file, admin_client, settings):
    settings.HOST, settings.PORT = "0.0.0.0", 8733
    page = admin_client.get(URL, HTTP_ACCEPT_LANGUAGE="en-US")
    assert page.status_code == 200
    html = unescape(page.content.decode())
    no_secret_in(html)
    assert "ws://127.0.0.1:8733/ws" in html
    assert 'enable_api_server = false\nhost = "127.0.0.1"\nport = 8733' in html
    assert "enable_api_server = true" in html and 'base_url = "ws://' in html
    assert 'config_version = "0.1.0"' in html and "[napcat_server]" in html
    assert 'data-secret-value="adapter:qq"' in html and "Show" in html
    assert "QQ has a token now" in html  # the legacy way is refused while qq has a token
    assert page["Cache-Control"].startswith("max-age=0") or "no-cache" in page["Cache-Control"]


def test_a_host_this_server_answers_to_leads_and_a_forged_one_is_refused(secrets_file, admin_client, settings):
    settings.ALLOWED_HOSTS = ["127.0.0.1", "localhost", "bot.example.com"]
    html = admin_client.get(URL, HTTP_HOST="bot.example.com").content.decode()
    assert html.index("ws://bot.example.com/ws") < html.index("ws://127.0.0.1:")
    assert admin_client.get(URL, HTTP_HOST="evil.example").status_code == 400


def test_the_dashboard_and_the_index_lead_to_the_page(admin_client):
    assert URL in admin_client.get("/admin/console/").content.decode()
    assert URL in admin_client.get("/admin/").content.decode()


def test_the_state_endpoint_lists_platforms_connected_and_last_seen(secrets_file, admin_client):
    AdapterConnection.objects.create(platform="qq", protocol="socketio", remote="127.0.0.1")
    old = AdapterConnection.objects.create(platform="discord", protocol="ws")
    AdapterConnection.objects.filter(pk=old.pk).update(disconnected_at=old.connected_at)
    data = admin_client.get(STATE).json()
    qq, discord = data["adapters"]
    assert (qq["platform"], qq["connected"], qq["protocol"]) == ("qq", True, "socketio")
    assert qq["since"].endswith("+08:00")  # the bot's zone, with its offset
    assert (discord["platform"], discord["connected"]) == ("discord", False) and discord["last_seen"]
    no_secret_in(str(data))


def test_a_superuser_reveals_on_post_and_it_is_recorded_without_the_value(secrets_file, admin_client):
    assert admin_client.get(SECRET).status_code == 405  # GET never reveals
    answer = admin_client.post(SECRET, {"action": "reveal", "secret": "adapter:qq"})
    assert answer.json() == {"ok": True, "value": TOKEN}
    assert "no-cache" in answer["Cache-Control"] or "max-age=0" in answer["Cache-Control"]
    assert admin_client.post(SECRET, {"action": "reveal", "secret": "model:OPENAI_API_KEY"}).json()["value"] == KEY
    history = list(ConfigChange.objects.order_by("at").values("user__username", "source", "changed_keys", "provider"))
    assert history == [
        {
            "user__username": "admin",
            "source": "secret revealed",
            "changed_keys": ["MAIBOT_ADAPTER_TOKENS[qq]"],
            "provider": {},
        },
        {"user__username": "admin", "source": "secret revealed", "changed_keys": ["OPENAI_API_KEY"], "provider": {}},
    ]
    no_secret_in(admin_client.get("/admin/maibot/configchange/").content.decode())
    assert admin_client.post(SECRET, {"action": "reveal", "secret": "model:SECRET_KEY"}).status_code == 400


def test_staff_without_the_permission_gets_403_and_never_the_secret(secrets_file):
    client = staff("view_console", "change_config", "change_llm_provider", "test_llm_models")
    html = client.get(URL).content.decode()
    no_secret_in(html)
    assert 'class="secret-reveal"' not in html and 'class="secret-rotate"' not in html
    for action, secret in [("reveal", "adapter:qq"), ("reveal", "model:OPENAI_API_KEY"), ("rotate", "adapter:qq"),
                           ("remove", "adapter:qq"), ("set", "model:OPENAI_API_KEY")]:  # fmt: skip
        answer = client.post(SECRET, {"action": action, "secret": secret, "value": "sk-attacker"})
        assert answer.status_code == 403
        no_secret_in(answer.content.decode())
    for page in ("/admin/console/", "/admin/config/", "/admin/config/raw/", "/admin/models/", STATE):
        no_secret_in(client.get(page).content.decode())
    assert deployment_env.read(secrets_file) == {"MAIBOT_ADAPTER_TOKENS": f"qq:{TOKEN}", "OPENAI_API_KEY": KEY}
    assert not ConfigChange.objects.exists()
    # Without view_console the page itself is closed too.
    assert staff_without_console().get(URL).status_code == 403


def staff_without_console() -> Client:
    user = User.objects.create_user("other", password="pw-123456", is_staff=True)
    client = Client()
    client.force_login(user)
    return client


def test_csrf_is_enforced(secrets_file):
    client = staff("view_console", "manage_secrets", csrf=True)
    for action in ("reveal", "rotate"):
        assert client.post(SECRET, {"action": action, "secret": "adapter:qq"}).status_code == 403
    token = client.get(URL).cookies["csrftoken"].value
    answer = client.post(SECRET, {"action": "reveal", "secret": "adapter:qq"}, HTTP_X_CSRFTOKEN=token)
    assert answer.json()["value"] == TOKEN


def test_rotating_the_token_refuses_the_old_one_and_admits_the_new_at_once(secrets_file, admin_client):
    assert auth("203.0.113.5", TOKEN) is None
    answer = admin_client.post(SECRET, {"action": "rotate", "secret": "adapter:qq"}).json()
    new = answer["value"]
    assert answer["ok"] and len(new) >= 32 and new != TOKEN
    assert deployment_env.read(secrets_file)["MAIBOT_ADAPTER_TOKENS"] == f"qq:{new}"
    assert auth("203.0.113.5", TOKEN) == "invalid token"
    assert auth("203.0.113.5", new) is None
    change = ConfigChange.objects.get()
    assert (change.source, change.changed_keys) == ("secret rotated", ["MAIBOT_ADAPTER_TOKENS[qq]"])
    no_secret_in(str(change.__dict__), new)
    html = admin_client.get(URL).content.decode()
    no_secret_in(html, new)
    # Removed: the legacy adapter on this machine is admitted again, the old holder from elsewhere is not.
    assert admin_client.post(SECRET, {"action": "remove", "secret": "adapter:qq"}).json()["ok"]
    assert "MAIBOT_ADAPTER_TOKENS" not in deployment_env.read(secrets_file)
    assert auth("127.0.0.1", None) is None
    assert auth("203.0.113.5", new) is not None


def test_a_file_changed_by_another_process_applies_here_on_next_use(secrets_file):
    deployment_env.update(secrets_file, {"OPENAI_API_KEY": "sk-changed-by-hand"})
    assert config.get_config().llm_models()["default"].api_key == "sk-changed-by-hand"
    deployment_env.update(secrets_file, {"MAIBOT_ADAPTER_TOKENS": "qq:tok-by-hand,discord:tok-2"})
    assert auth("203.0.113.5", "tok-by-hand") is None
    # A broken hand edit keeps the tokens in force and says so in the log (not the token).
    deployment_env.update(secrets_file, {"MAIBOT_ADAPTER_TOKENS": "qq:tok-a,discord:tok-a"})
    assert auth("203.0.113.5", "tok-by-hand") is None


def test_a_new_model_key_is_used_by_the_next_call_and_recorded(secrets_file, admin_client):
    answer = admin_client.post(SECRET, {"action": "set", "secret": "model:OPENAI_API_KEY", "value": " sk-new-1 "})
    assert answer.json()["ok"]
    assert config.get_config().llm_models()["default"].api_key == "sk-new-1"
    assert deployment_env.read(secrets_file)["OPENAI_API_KEY"] == "sk-new-1"
    change = ConfigChange.objects.get()
    assert (change.source, change.changed_keys, change.provider) == ("secret changed", ["OPENAI_API_KEY"], {})
    for bad in ("", "two words", "x" * 513):
        answer = admin_client.post(SECRET, {"action": "set", "secret": "model:OPENAI_API_KEY", "value": bad})
        assert answer.status_code == 400 and answer.json()["error"]
    assert deployment_env.read(secrets_file)["OPENAI_API_KEY"] == "sk-new-1"
    # A variable the config does not use as a key cannot be written (nor any other environment variable).
    for name in ("SECRET_KEY", "DATABASE_URL", "MAIBOT_SETUP_HOST"):
        answer = admin_client.post(SECRET, {"action": "set", "secret": f"model:{name}", "value": "x"})
        assert answer.status_code == 400
    assert set(deployment_env.read(secrets_file)) == {"MAIBOT_ADAPTER_TOKENS", "OPENAI_API_KEY"}


def test_a_secret_the_environment_sets_is_shown_but_not_changed(secrets_file, admin_client, monkeypatch):
    monkeypatch.setattr(deployment_env, "_from_environment", {"OPENAI_API_KEY"})
    html = unescape(admin_client.get(URL, HTTP_ACCEPT_LANGUAGE="en-US").content.decode())
    assert "(set in the server's environment)" in html
    answer = admin_client.post(SECRET, {"action": "set", "secret": "model:OPENAI_API_KEY", "value": "sk-x"})
    assert answer.status_code == 400 and "environment" in answer.json()["error"]
    assert deployment_env.read(secrets_file)["OPENAI_API_KEY"] == KEY
    assert django_settings.MAIBOT_ADAPTER_TOKENS  # untouched
