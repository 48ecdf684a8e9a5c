"""A first run without traps: the set-up page answers the address the operator opened it with, remembers
that one (and only that one, never a host an attacker sent), and then refuses other hosts with a page
saying what to configure; `/` and the login lead to the dashboard; the set-up page says how the QQ
adapter connects; `plugins/` exists from the first run."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

from chat.gateway.auth import adapter_auth_problem
from core import deployment_env, hosts, setup
from core.adapter_tokens import parse_adapter_tokens
from tests.core.test_setup_page import FORM

pytestmark = pytest.mark.django_db

OPERATOR_HOST = "203.0.113.5:8733"  # the server's public address, as the operator typed it
EVIL_HOST = "rebind.evil.example"  # a hostile name resolving to this server (DNS rebinding)


@pytest.fixture
def first_run(settings, tmp_path) -> str:
    """A process started while the set-up is pending, as settings.py makes it (core.hosts)."""
    settings.DATA_DIR = tmp_path
    settings.MAIBOT_ADAPTER_TOKENS = ()
    code = setup.issue_code()
    allowed, any_host = hosts.allowed_hosts({}, data_dir=tmp_path)
    assert any_host and allowed == ["127.0.0.1", "localhost", "[::1]", "*"]
    settings.ALLOWED_HOSTS = [*allowed, "testserver"]
    settings.MAIBOT_FIRST_RUN_ANY_HOST = True
    settings.CSRF_TRUSTED_ORIGINS = []
    return code


def env_file(settings):
    return deployment_env.read(settings.DATA_DIR / deployment_env.FILE_NAME)


def test_allowed_hosts_at_start(tmp_path):
    assert hosts.allowed_hosts({}, data_dir=tmp_path) == (["127.0.0.1", "localhost", "[::1]"], False)
    environ = {"ALLOWED_HOSTS": "bot.example.com", hosts.SETUP_HOST: "203.0.113.5"}
    assert hosts.allowed_hosts(environ, data_dir=tmp_path) == (["bot.example.com", "203.0.113.5"], False)
    (tmp_path / hosts.SETUP_CODE_FILE).write_text("code\n")
    assert hosts.allowed_hosts(environ, data_dir=tmp_path) == (["bot.example.com", "203.0.113.5", "*"], True)
    # An operator who allows every host on purpose keeps it after the set-up too.
    assert hosts.allowed_hosts({"ALLOWED_HOSTS": "*"}, data_dir=tmp_path) == (["*"], False)


def test_the_set_up_page_answers_the_address_it_was_opened_with(first_run, client):
    page = client.get("/setup/", HTTP_HOST=OPERATOR_HOST)
    assert page.status_code == 200
    # The adapter snippet for the token way names the address the browser used.
    assert f"base_url = &quot;ws://{OPERATOR_HOST}/ws&quot;" in page.content.decode()
    assert client.get("/admin/", HTTP_HOST=OPERATOR_HOST).url == "/setup/"  # pages still lead to it


def test_the_operators_host_is_remembered_and_an_attackers_never(first_run, client, settings):
    attacker = Client()
    assert attacker.get("/setup/", HTTP_HOST=EVIL_HOST).status_code == 200  # the page, nothing more
    takeover = {**FORM, "username": "mallory", "code": "guess"}
    assert attacker.post("/setup/", takeover, HTTP_HOST=EVIL_HOST).status_code == 403

    done = client.post("/setup/", {**FORM, "code": first_run}, HTTP_HOST=OPERATOR_HOST)
    assert done.status_code == 302 and done.url == "/"
    assert env_file(settings) == {"MAIBOT_ADAPTER_TOKENS": "qq:tok-123", hosts.SETUP_HOST: "203.0.113.5"}
    assert "*" not in settings.ALLOWED_HOSTS and not settings.MAIBOT_FIRST_RUN_ANY_HOST

    refused = attacker.get("/admin/login/", HTTP_HOST=EVIL_HOST)
    assert refused.status_code == 400
    text = refused.content.decode()
    assert "ALLOWED_HOSTS" in text and "rebind.evil.example" in text
    assert client.get("/", HTTP_HOST=OPERATOR_HOST).url == "/admin/console/"  # logged in, at the dashboard
    assert client.get("/admin/console/", HTTP_HOST=OPERATOR_HOST).status_code == 200
    assert list(get_user_model().objects.values_list("username", flat=True)) == ["op"]

    # The next start: the recorded host stays, any host is gone (the code file is).
    restarted, any_host = hosts.allowed_hosts(env_file(settings), data_dir=settings.DATA_DIR)
    assert (restarted, any_host) == (["127.0.0.1", "localhost", "[::1]", "203.0.113.5"], False)


def test_a_forwarded_host_is_not_believed_and_loopback_is_not_recorded(first_run, client, settings):
    done = client.post(
        "/setup/", {**FORM, "code": first_run}, HTTP_HOST="127.0.0.1:8733", HTTP_X_FORWARDED_HOST=EVIL_HOST
    )
    assert done.url == "/"
    assert hosts.SETUP_HOST not in env_file(settings)
    assert Client().get("/admin/login/", HTTP_HOST=EVIL_HOST).status_code == 400


def test_through_an_untrusted_tls_proxy_the_origin_is_trusted_for_the_login(first_run, client, settings):
    origin = "https://bot.example.com"
    done = client.post("/setup/", {**FORM, "code": first_run}, HTTP_HOST="bot.example.com", HTTP_ORIGIN=origin)
    assert done.url == "/"
    assert env_file(settings)[hosts.SETUP_ORIGIN] == origin
    browser = Client(enforce_csrf_checks=True)
    form = browser.get("/admin/login/", HTTP_HOST="bot.example.com").content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)
    login = {"csrfmiddlewaretoken": token, "username": "op", "password": FORM["password"], "next": "/"}
    answer = browser.post("/admin/login/", login, HTTP_HOST="bot.example.com", HTTP_ORIGIN=origin)
    assert answer.status_code == 302 and answer.url == "/"
    # Another site's origin is still refused.
    forged = browser.post("/admin/login/", login, HTTP_HOST="bot.example.com", HTTP_ORIGIN="https://evil.example")
    assert forged.status_code == 403


def test_a_process_that_did_not_complete_the_set_up_stops_answering_any_host(first_run, settings):
    setup.close()  # the set-up was completed by another process (or `createsuperuser`)
    assert Client().get("/healthz", HTTP_HOST=EVIL_HOST).status_code == 400
    assert "*" not in settings.ALLOWED_HOSTS
    assert Client().get("/healthz", HTTP_HOST="127.0.0.1:8733").status_code in (200, 503)


# --- the way in: / and the login lead to the dashboard ------------------------------------------------


def test_root_and_login_lead_to_the_dashboard(db):
    User.objects.create_superuser("boss", password="pw-123456")
    browser = Client()
    assert browser.get("/").url == "/admin/"  # not logged in: the admin asks for the login
    page = browser.get("/admin/login/").content.decode()
    assert 'name="next" value="/"' in page
    landed = browser.post("/admin/login/", {"username": "boss", "password": "pw-123456", "next": "/"}, follow=True)
    assert landed.redirect_chain[-1][0] == "/admin/console/" and landed.status_code == 200


def test_root_leads_staff_without_the_console_permission_to_the_admin(db):
    staff = User.objects.create_user("helper", password="pw-123456", is_staff=True)
    browser = Client()
    browser.force_login(staff)
    assert browser.get("/").url == "/admin/"


# --- the set-up page and the QQ adapter ---------------------------------------------------------------------


def test_the_set_up_page_explains_both_ways_for_the_adapter(first_run, client, settings):
    text = client.get("/setup/").content.decode()
    assert 'value="local"' in text and 'value="token"' in text
    assert re.search(r'value="local"[^>]*checked', text)  # the default: no token, adapter on this machine
    assert f"port = {settings.PORT}" in text and "enable_api_server = true" in text
    assert "legacy mode" in text and "is refused" in text


def test_without_a_token_a_legacy_adapter_on_this_machine_connects(first_run, client, settings):
    done = client.post("/setup/", {**FORM, "code": first_run, "adapter_mode": "local"})
    assert done.url == "/"
    assert "MAIBOT_ADAPTER_TOKENS" not in env_file(settings)
    # The gateway's rule with what the set-up saved: a token-less qq adapter on loopback is let in.
    settings.MAIBOT_ADAPTER_TOKENS = parse_adapter_tokens(env_file(settings).get("MAIBOT_ADAPTER_TOKENS", ""), name="x")
    assert adapter_auth_problem(platform="qq", token=None, client_host="127.0.0.1") is None
    assert adapter_auth_problem(platform="qq", token=None, client_host="203.0.113.9") is not None


def test_the_token_way_needs_a_token(first_run, client):
    page = client.post("/setup/", {**FORM, "code": first_run, "adapter_mode": "token", "adapter_token": ""})
    assert page.status_code == 200 and "Give the token your adapter will send" in page.content.decode()
    assert setup.setup_pending()


def test_plugins_folder_exists_from_the_first_run(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    call_command("bootstrap", "--setup-page")
    plugins = tmp_path / "plugins"
    assert plugins.is_dir() and plugins.stat().st_mode & 0o777 == 0o700


def test_the_refusal_says_what_to_do_in_the_browsers_language(first_run):
    setup.close()
    refused = Client(HTTP_ACCEPT_LANGUAGE="zh-CN,zh;q=0.9").get("/admin/login/", HTTP_HOST=EVIL_HOST)
    assert refused.status_code == 400
    assert "本服务器不响应名称“rebind.evil.example”" in refused.content.decode()
