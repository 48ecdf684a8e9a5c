"""The model test in the console: one tiny call with one tool to each configured model, through the real
openai client against the scripted server; how each went (answered, or the kind of failure), latency and
tool calling shown, never what came back (a model pointed at an internal service cannot be used to read
it); only for those with the permission. (The page in headless Chromium: test_console_models_browser.py.)"""

from __future__ import annotations

import json
import re

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from chat.models import LLMCall
from core import config
from tests.fake_llm import FakeLLM
from tests.internal_service import SECRET, BannerService, InternalService

pytestmark = pytest.mark.django_db(transaction=True)


def answer_by_model(provider: FakeLLM):
    """good-1 calls the tool as asked, chatty-1 answers in text, broken-1 fails with 500."""

    def answer(body):
        return {
            "good-1": provider.tool_call("echo", {"word": "ping"}),
            "chatty-1": provider.text("pong!"),
        }.get(body["model"], provider.error(500, "the provider is down"))

    return answer


def models_config(provider: FakeLLM):
    return config.override(
        llm={
            "models": [
                {"name": name, "base_url": provider.base_url, "model": f"{name}-1"}
                for name in ("good", "chatty", "broken")
            ]
        }
    )


@pytest.fixture
def provider():
    with FakeLLM() as server:
        server.default = answer_by_model(server)
        yield server


def client_for(*perms: str, superuser: bool = False) -> Client:
    user = User.objects.create_user("staff", password="pw-123456", is_staff=True, is_superuser=superuser)
    for perm in perms:
        user.user_permissions.add(Permission.objects.get(codename=perm))
    client = Client()
    client.force_login(user)
    return client


def rows(page: str) -> dict[str, str]:
    results = page.split('id="model-test-results"', 1)[1]
    return {part.split('"', 1)[0]: part.split("</tr>", 1)[0] for part in results.split('data-model="')[1:]}


def test_each_model_is_tested_with_one_tool_and_the_outcome_shown(provider):
    client = client_for("test_llm_models")
    with models_config(provider):
        listing = client.get("/admin/models/").content.decode()
        assert listing.count('value="Test"') == 3 and provider.requests == []
        page = client.post("/admin/models/").content.decode()
    found = rows(page)
    assert 'class="tool-calling">works<' in found["good"] and ">answered<" in found["good"]
    assert 'class="tool-calling">no tool call<' in found["chatty"] and ">answered<" in found["chatty"]
    # Answering without calling the tool is no "OK": the row warns, and the page says why.
    assert 'class="outcome console-ok"' in found["good"] and 'class="outcome console-warn"' in found["chatty"]
    warnings = re.findall(r'data-warning-model="(\w+)">\s*Warning: “\w+” answered but did not call', page)
    assert warnings == ["chatty"]
    assert ">failed: HTTP 500<" in found["broken"]
    assert all(" ms</td>" in row for row in found.values())
    # What came back is not on the page: not the words, not the call, not the provider's message.
    assert "pong!" not in page and "echo(" not in page and "the provider is down" not in page
    # One request each, with the one tool offered; each is in the ledger.
    assert sorted(r["model"] for r in provider.requests) == ["broken-1", "chatty-1", "good-1"]
    assert all([t["function"]["name"] for t in r["tools"]] == ["echo"] for r in provider.requests)
    assert LLMCall.objects.filter(purpose="model_test", task="utility").count() == 3


@pytest.fixture
def config_file(settings, tmp_path):
    from core import reload
    from core.config import render_template

    settings.DATA_DIR = tmp_path
    path = tmp_path / "bot_config.toml"
    path.write_text(render_template(), encoding="utf-8")
    reload._applied_digest = None
    reload.last_error = reload.last_result = None
    yield path
    reload.last_error = reload.last_result = None


def staff_who_may_point_and_test_models() -> Client:
    """The attacker: a staff user (no superuser) who may change the provider and test the models."""
    return client_for("change_config", "change_llm_provider", "test_llm_models")


@pytest.mark.parametrize(
    ("service", "outcome"),
    [
        (lambda: InternalService(403, "text/html", f"<h1>admin of {SECRET}</h1>"), "failed: HTTP 403"),
        (lambda: InternalService(200, "text/plain", f"ami-id: {SECRET}"), "failed: not a chat-completions answer"),
        (
            lambda: InternalService(200, "application/json", json.dumps({"secret": SECRET})),
            "failed: not a chat-completions answer",
        ),
        (
            lambda: InternalService(200, "application/json", json.dumps({"choices": {"0": SECRET}})),
            "failed: not a chat-completions answer",
        ),
        (
            lambda: InternalService(500, "application/json", json.dumps({"error": {"message": SECRET}})),
            "failed: HTTP 500",
        ),
        (lambda: InternalService(200, "application/json", json.dumps(FakeLLM.text(SECRET))), "answered"),
        (BannerService, "failed: connection failed"),
    ],
    ids=["html-403", "text-200", "json-200", "choices-object", "json-error-message", "chat-answer", "not-http"],
)
def test_a_model_pointed_at_an_internal_service_shows_how_it_went_never_what_it_answered(config_file, service, outcome):
    from core import reload

    attacker = staff_who_may_point_and_test_models()
    internal = service()
    try:
        current = config_file.read_text(encoding="utf-8")
        model = f'\n[[llm.models]]\nname = "probe"\nmodel = "m"\nbase_url = "{internal.url}"\n'
        saved = attacker.post(
            "/admin/config/raw/", {"toml": current + model, "base_digest": reload.text_digest(current)}
        )
        assert saved.status_code == 302 and [m.name for m in config.get_config().llm.models] == ["probe"]
        response = attacker.post("/admin/models/", {"model": "probe"})
    finally:
        internal.close()
    page = response.content.decode()
    assert internal.hits == 1 and response.status_code == 200
    assert SECRET not in page
    # A chat answer without the tool call is a warning: the bot cannot act through that model.
    assert f'class="outcome console-{"warn" if outcome == "answered" else "down"}">{outcome}<' in rows(page)["probe"]


def test_one_model_may_be_tested_alone(provider):
    client = client_for("test_llm_models")
    with models_config(provider):
        page = client.post("/admin/models/", {"model": "good"}).content.decode()
    assert list(rows(page)) == ["good"] and [r["model"] for r in provider.requests] == ["good-1"]


def test_the_model_test_needs_its_permission(provider):
    with models_config(provider):
        viewer = client_for("view_console", "change_config")
        assert viewer.get("/admin/models/").status_code == 403
        assert viewer.post("/admin/models/").status_code == 403
        assert "console-models" not in viewer.get("/admin/").content.decode()
        assert 'href="/admin/models/"' not in viewer.get("/admin/").content.decode()
    assert provider.requests == []


def test_with_no_model_the_page_says_offline(db):
    client = client_for(superuser=True)
    page = client.get("/admin/models/").content.decode()
    assert "No model is configured" in page and "Test every model" not in page


def test_adding_a_model_or_moving_its_provider_needs_the_provider_permission(config_file):
    from core import reload
    from core.models import ConfigChange

    before = config_file.read_text(encoding="utf-8")
    model = '\n[[llm.models]]\nname = "cheap"\nmodel = "mini"\nbase_url = "https://llm.example/v1"\n'
    budgets = '\n[[llm.budgets]]\nscope = "task"\ntarget = "planner"\ndaily_tokens = 5000\n'
    editor = client_for("change_config")
    page = editor.post(
        "/admin/config/raw/", {"toml": before + model, "base_digest": reload.text_digest(before)}
    ).content.decode()
    assert "llm.models: changing the model provider needs the permission" in page
    assert config_file.read_text(encoding="utf-8") == before and config.get_config().llm.models == []
    # Budgets, tasks and talk rules are theirs to change; a superuser adds the model, recorded.
    editor.post("/admin/config/raw/", {"toml": before + budgets, "base_digest": reload.text_digest(before)})
    assert config.get_config().llm.budgets[0].daily_tokens == 5000
    operator = Client()
    operator.force_login(User.objects.create_superuser("op", password="pw-123456"))
    current = config_file.read_text(encoding="utf-8")
    operator.post("/admin/config/raw/", {"toml": current + model, "base_digest": reload.text_digest(current)})
    assert [m.name for m in config.get_config().llm.models] == ["cheap"]
    change = ConfigChange.objects.order_by("-at").first()
    assert change.user.username == "op"
    assert change.provider == {"llm.models": [[], [["cheap", "https://llm.example/v1", "OPENAI_API_KEY"]]]}
    # The form editor leaves the tables alone when saving other keys.
    from tests.console.test_console_config_editor import form_data

    operator.post("/admin/config/", form_data(operator) | {"chat__max_rounds": "4"})
    after = config_file.read_text(encoding="utf-8")
    assert after.endswith(model) and "max_rounds = 4" in after and "[[llm.budgets]]" in after
