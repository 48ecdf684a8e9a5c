"""The set-up page attacked in-process: wrong codes are counted and locked out (per client, for everyone,
across processes), an operator made any other way closes the page, and the model *Test* never shows what
the remote end sent. Through a real reverse proxy: tests/maibot/test_behind_proxy.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from core import deployment_env, setup
from tests.conftest import ROOT
from tests.fake_llm import FakeLLM
from tests.internal_service import SECRET, InternalService

pytestmark = pytest.mark.django_db

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


def far(address: str = "203.0.113.9") -> dict:
    return {"REMOTE_ADDR": address}


@pytest.fixture
def code(settings, tmp_path) -> str:
    settings.DATA_DIR = tmp_path
    settings.MAIBOT_ADAPTER_TOKENS = []
    return setup.issue_code()


def _guess(client, n: int, address: str) -> list[int]:
    return [client.post("/setup/", {**FORM, "code": f"guess-{i}"}, **far(address)).status_code for i in range(n)]


# --- wrong codes ------------------------------------------------------------------------------------------


def test_after_five_wrong_codes_a_client_is_locked_out_even_with_the_right_code(code, client):
    assert _guess(client, setup.MAX_FAILURES_PER_CLIENT, "203.0.113.9") == [403] * setup.MAX_FAILURES_PER_CLIENT
    locked = client.post("/setup/", {**FORM, "code": code}, **far("203.0.113.9"))
    assert locked.status_code == 429 and "Too many wrong codes" in locked.content.decode()
    test = client.post("/setup/test-model/", {"code": code}, **far("203.0.113.9"))
    assert test.status_code == 429 and "Too many wrong codes" in test.json()["error"]
    assert not get_user_model().objects.exists()
    # Another client still may, with the code.
    assert client.post("/setup/", {**FORM, "code": code}, **far("198.51.100.4")).url == "/"
    assert get_user_model().objects.get().username == "op"


def test_an_ipv6_client_counts_as_its_whole_64(code, client):
    for i in range(setup.MAX_FAILURES_PER_CLIENT):
        client.post("/setup/", {**FORM, "code": "x"}, **far(f"2001:db8:1:2::{i + 1}"))
    assert client.post("/setup/", {**FORM, "code": code}, **far("2001:db8:1:2::ffff")).status_code == 429
    assert client.post("/setup/", {**FORM, "code": code}, **far("2001:db8:1:3::1")).url == "/"


def test_wrong_codes_from_many_addresses_lock_everyone_out_until_the_window_passes(code, client, monkeypatch):
    clock = [1_000_000.0]
    monkeypatch.setattr(setup.time, "time", lambda: clock[0])
    per = setup.MAX_FAILURES_PER_CLIENT
    for n in range(setup.MAX_FAILURES // per):
        assert _guess(client, per, f"198.51.100.{n + 1}") == [403] * per
    # The model Test's wrong codes count too, and nobody gets in now, not even with the code.
    assert client.post("/setup/test-model/", {"code": code}, **far("192.0.2.77")).status_code == 429
    assert client.post("/setup/", {**FORM, "code": code}, **far("192.0.2.77")).status_code == 429
    clock[0] += setup.FAILURE_WINDOW + 1
    assert client.post("/setup/", {**FORM, "code": code}, **far("192.0.2.77")).url == "/"


def test_the_model_tests_wrong_codes_are_counted_like_the_forms(code, client):
    for _ in range(setup.MAX_FAILURES_PER_CLIENT):
        assert client.post("/setup/test-model/", {"code": "nope"}, **far()).status_code == 403
    assert client.post("/setup/", {**FORM, "code": code}, **far()).status_code == 429


def test_concurrent_guessers_in_other_processes_share_one_count(code, settings, tmp_path):
    """Four processes guess at once from one address: together they get exactly the limit's guesses
    compared (a count kept per process, or read and written without the lock, would allow more)."""
    script = (
        "import django, json, sys; django.setup()\n"
        "from core import setup\n"
        "print('ready', flush=True); sys.stdin.readline()\n"
        "out = [setup.code_attempt(f'wrong-{i}', client='203.0.113.50') for i in range(15)]\n"
        "print(json.dumps([c.retry_after for c in out]))\n"
    )
    env = {"MAIBOT_DATA_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "maibot.settings", "PATH": "/usr/bin:/bin"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script], cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    for proc in procs:  # all of them imported and waiting: then they start together
        assert proc.stdout.readline().strip() == "ready"
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    results = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    compared = sum(1 for run in results for retry_after in run if retry_after == 0)
    assert compared == setup.MAX_FAILURES_PER_CLIENT, results
    assert setup.code_attempt(code, client="203.0.113.50").retry_after > 0


# --- the page closes ----------------------------------------------------------------------------------------


def test_an_operator_made_with_createsuperuser_closes_the_set_up_for_good(code, client, monkeypatch, tmp_path):
    monkeypatch.setenv("DJANGO_SUPERUSER_PASSWORD", "another-long-password")
    call_command("createsuperuser", "--noinput", username="boss", email="boss@example.com", verbosity=0)
    # The admin leads to its login, not to the set-up; the set-up leads away and its code is gone.
    assert client.get("/admin/").url.startswith("/admin/login/")
    assert client.get("/setup/").url == "/admin/"
    assert not (tmp_path / setup.CODE_FILE).exists()
    # The old code makes no second operator, and the Test is closed too.
    client.post("/setup/", {**FORM, "username": "intruder", "code": code})
    assert client.post("/setup/test-model/", {"code": code}).status_code == 404
    assert list(get_user_model().objects.values_list("username", flat=True)) == ["boss"]
    assert not (tmp_path / deployment_env.FILE_NAME).exists()


def test_a_start_after_createsuperuser_removes_a_leftover_code(code, tmp_path):
    get_user_model().objects.create_superuser(username="boss", email="", password="x-long-password")
    call_command("bootstrap", "--setup-page", verbosity=0)
    assert not (tmp_path / setup.CODE_FILE).exists()


def test_a_form_that_passed_its_checks_makes_no_operator_once_one_exists(code, client, monkeypatch):
    """The second of two concurrent completions: its code was right, but by the time it holds the
    set-up's lock an operator exists."""
    from console import setup as setup_page

    real_finish = setup_page._finish

    def operator_first(data, cfg, request):
        get_user_model().objects.create_superuser(username="first", email="", password="x-long-password")
        return real_finish(data, cfg, request)

    monkeypatch.setattr(setup_page, "_finish", operator_first)
    done = client.post("/setup/", {**FORM, "code": code}, **far())
    assert done.url == "/admin/"
    assert list(get_user_model().objects.values_list("username", flat=True)) == ["first"]
    assert client.get("/admin/").url.startswith("/admin/login/")  # not logged in as anyone


# --- the model Test -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "content_type", "body", "outcome"),
    [
        (500, "application/json", json.dumps({"error": {"message": SECRET}}), "HTTP 500"),
        (403, "text/html", f"<h1>{SECRET}</h1>", "HTTP 403"),
        (200, "text/plain", SECRET, "not a chat-completions answer"),
        (200, "application/json", json.dumps({"secret": SECRET}), "not a chat-completions answer"),
    ],
)
def test_the_model_test_shows_the_outcome_never_the_remote_body(code, client, status, content_type, body, outcome):
    service = InternalService(status, content_type, body)
    try:
        response = client.post(
            "/setup/test-model/", {"code": code, "llm_base_url": service.url, "llm_model": "m"}, **far()
        )
    finally:
        service.close()
    assert service.hits == 1
    assert response.status_code == 200 and SECRET not in response.content.decode()
    assert response.json()["ok"] is False and response.json()["outcome"] == outcome


def test_a_model_answering_shows_ok_and_whether_it_called_the_tool_but_not_its_words(code, client):
    with FakeLLM() as provider:
        provider.script(provider.text(SECRET), provider.tool_call("echo", {"word": "ping"}))
        form = {"code": code, "llm_base_url": provider.base_url, "llm_model": "fake-1"}
        words = client.post("/setup/test-model/", form, **far()).json()
        tool = client.post("/setup/test-model/", form, **far()).json()
    assert SECRET not in json.dumps(words)
    assert words["ok"] is True and words["outcome"] == "ok" and words["tool_calling"] is False
    assert tool["ok"] is True and tool["tool_calling"] is True


def test_the_model_test_without_the_code_calls_nothing(code, client):
    service = InternalService(200, "text/plain", SECRET)
    try:
        for given in ("", "wrong"):
            response = client.post(
                "/setup/test-model/", {"code": given, "llm_base_url": service.url, "llm_model": "m"}, **far()
            )
            assert response.status_code == 403 and SECRET not in response.content.decode()
    finally:
        service.close()
    assert service.hits == 0


def test_the_model_test_calls_only_http_urls(code, client):
    response = client.post(
        "/setup/test-model/", {"code": code, "llm_base_url": "file:///etc/passwd", "llm_model": "m"}, **far()
    )
    assert response.status_code == 400 and "http://" in response.json()["error"]
