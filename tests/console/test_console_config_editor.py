"""The config editor in the admin (Django test client): the form generated from the config model, the
raw TOML view, comments kept on save, errors per field with nothing changed, and who may use it."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from core import reload
from core.config import TEMPLATE_PATH, get_config, render_template
from core.models import ConfigChange
from tests.conftest import wait_for

pytestmark = pytest.mark.backend_independent

NOTE = "# 运营备注 operator note: keep the persona short\n"


@pytest.fixture
def config_file(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    path = tmp_path / "bot_config.toml"
    text = render_template().replace("[bot]\n", f"[bot]\n{NOTE}", 1)
    text = text.replace("max_rounds = 5", "max_rounds = 5  # raised from 3 after the 11-04 incident")
    path.write_text(text, encoding="utf-8")
    reload._applied_digest = None
    reload.last_error = reload.last_result = None
    yield path
    reload.last_error = reload.last_result = None


@pytest.fixture
def operator(db) -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("op", password="pw-123456"))
    return client


class _FormFields(HTMLParser):
    """Collects what a browser would submit from the editor's form."""

    def __init__(self) -> None:
        super().__init__()
        self.data: dict[str, str] = {}
        self._textarea: str | None = None
        self._select: str | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "select":
            self._select = a["name"]
        elif tag == "option" and self._select:
            # A browser submits the selected option, else the first.
            if self._select not in self.data or "selected" in a:
                self.data[self._select] = a.get("value", "")
        elif tag == "input" and a.get("name") and a.get("type") != "submit":
            if a.get("type") == "checkbox":
                if "checked" in a:
                    self.data[a["name"]] = "on"
            else:
                self.data[a["name"]] = a.get("value", "")
        elif tag == "textarea":
            self._textarea = a["name"]
            self.data[self._textarea] = ""

    def handle_data(self, data):
        if self._textarea:
            self.data[self._textarea] += data

    def handle_endtag(self, tag):
        if tag == "textarea":
            self._textarea = None
        elif tag == "select":
            self._select = None


def form_data(client: Client, url: str = "/admin/config/") -> dict[str, str]:
    """The editor's form as the browser would submit it unchanged."""
    return form_data_from(client.get(url).content.decode())


def form_data_from(page: str) -> dict[str, str]:
    parser = _FormFields()
    parser.feed(page)
    # Browsers drop the one newline that follows <textarea>.
    return {k: v[1:] if v.startswith("\n") else v for k, v in parser.data.items()}


def test_committed_template_is_generated_from_the_model():
    assert TEMPLATE_PATH.read_text(encoding="utf-8") == render_template()


def test_form_has_a_fieldset_per_section_with_help_text_and_the_restart_flag(operator, config_file):
    page = operator.get("/admin/config/").content.decode()
    for section in ("bot", "llm", "chat", "scheduling", "gateway", "api", "life", "console"):
        assert f'id="section-{section}"' in page
    assert "The persona given to the model at the top of every prompt." in page
    assert 'name="bot__alias_names"' in page and "MaiBot\n麦麦" in page  # list[str]: one per line
    assert 'type="checkbox" name="console__health_requires_adapter"' in page
    assert 'type="number" name="llm__temperature"' in page
    restart_fields = (
        "console__reload_debounce_ms",
        "gateway__keepalive_seconds",
        "plugins__hot_reload",
        "plugins__reload_debounce_ms",
    )
    for field in restart_fields:
        restart_row = page.split(f'field-{field}"', 1)[1].split("form-row", 1)[0]
        assert "Needs a restart" in restart_row
    assert page.count("Needs a restart") == 4


def test_saving_the_form_changes_values_keeps_comments_and_applies_at_once(operator, config_file):
    before = config_file.read_text(encoding="utf-8")
    data = form_data(operator)
    data.update({"bot__nickname": "小麦", "chat__history_window": "12", "bot__alias_names": "Mai\n小麦\n"})
    data.pop("console__health_requires_adapter", None)
    data["console__health_requires_adapter"] = "on"

    response = operator.post("/admin/config/", data)

    assert response.status_code == 302, response.content.decode()[:2000]
    after = config_file.read_text(encoding="utf-8")
    assert NOTE in after
    assert "max_rounds = 5  # raised from 3 after the 11-04 incident" in after
    assert 'nickname = "小麦"' in after and "history_window = 12" in after
    assert "health_requires_adapter = true" in after
    changed = [line for line in after.splitlines() if line not in before.splitlines()]
    assert len(changed) == 4, changed  # the four values, nothing else re-rendered
    cfg = get_config()
    assert (cfg.bot.nickname, cfg.chat.history_window, cfg.bot.alias_names) == ("小麦", 12, ["Mai", "小麦"])
    assert cfg.console.health_requires_adapter is True
    page = operator.get("/admin/config/").content.decode()
    assert "Saved and applied" in page and "bot.nickname" in page


def test_invalid_form_input_shows_errors_at_the_fields_and_changes_nothing(operator, config_file):
    before = config_file.read_text(encoding="utf-8")
    data = form_data(operator)
    data.update(
        {
            "chat__max_rounds": "0",
            "bot__language": "english please",
            "bot__time_zone": "Mars/Olympus",
            "llm__timeout": "x",
        }
    )

    response = operator.post("/admin/config/", data)

    assert response.status_code == 200
    page = response.content.decode()
    assert "Nothing was saved" in page

    def row(name: str) -> str:
        return page.split(f"field-{name}", 1)[1].split("form-row", 1)[0]

    assert "greater than or equal to 1" in row("chat__max_rounds")
    assert "should match pattern" in row("bot__language")
    assert "unknown time zone" in row("bot__time_zone")
    assert "Enter a number" in row("llm__timeout")
    assert config_file.read_text(encoding="utf-8") == before
    assert get_config().chat.max_rounds == 5


def test_raw_view_validates_before_saving(operator, config_file):
    before = config_file.read_text(encoding="utf-8")
    page = operator.get("/admin/config/raw/").content.decode()
    assert "运营备注" in page

    bad = before.replace("max_rounds = 5", "max_rounds = 50")
    raw = form_data(operator, "/admin/config/raw/")
    response = operator.post("/admin/config/raw/", {**raw, "toml": bad})
    assert response.status_code == 200
    assert "Not saved" in response.content.decode() and "chat.max_rounds" in response.content.decode()
    assert config_file.read_text(encoding="utf-8") == before

    response = operator.post("/admin/config/raw/", {**raw, "toml": "[bot\n"})
    assert "not valid TOML" in response.content.decode()
    assert config_file.read_text(encoding="utf-8") == before

    good = before.replace('persona = "', 'persona = "Speak English. ', 1)
    response = operator.post("/admin/config/raw/", {**raw, "toml": good.replace("\n", "\r\n")})
    assert response.status_code == 302
    assert config_file.read_text(encoding="utf-8") == good
    assert get_config().bot.persona.startswith("Speak English. ")


def test_a_failed_reload_shows_a_banner_in_the_admin(operator, config_file):
    config_file.write_text("[chat]\nmax_rounds = -1\n", encoding="utf-8")
    reload.reload_from_file(config_file)
    page = operator.get("/admin/").content.decode()
    assert 'id="config-reload-error"' in page
    assert "chat.max_rounds" in page and "previous configuration is still in force" in page
    # The editor still opens, showing the config in force and what is wrong with the file.
    page = operator.get("/admin/config/").content.decode()
    assert "not valid right now" in page
    assert 'name="chat__max_rounds" value="5"' in page


def test_only_operators_may_edit(db, config_file):
    anonymous = Client()
    assert anonymous.get("/admin/config/")["Location"].startswith("/admin/login/")
    assert anonymous.post("/admin/config/raw/", {"toml": "x"}).status_code == 302

    staff = User.objects.create_user("staff", password="pw-123456", is_staff=True)
    client = Client()
    client.force_login(staff)
    assert client.get("/admin/config/").status_code == 403
    assert client.post("/admin/config/raw/", {"toml": "[bot]\n"}).status_code == 403

    staff.user_permissions.add(Permission.objects.get(codename="change_config"))
    client.force_login(User.objects.get(pk=staff.pk))
    assert client.get("/admin/config/").status_code == 200

    user = User.objects.create_user("someone", password="pw-123456")
    client.force_login(user)
    assert client.get("/admin/config/").status_code == 302
    assert config_file.read_text(encoding="utf-8").count("运营备注") == 1


def test_posts_need_the_csrf_token(db, config_file):
    client = Client(enforce_csrf_checks=True)
    client.force_login(User.objects.create_superuser("op", password="pw-123456"))
    before = config_file.read_text(encoding="utf-8")
    assert client.post("/admin/config/raw/", {"toml": before.replace("麦麦", "x")}).status_code == 403
    assert config_file.read_text(encoding="utf-8") == before


def test_a_save_runs_the_callbacks_once_with_the_watcher_running(operator, config_file, monkeypatch):
    calls = []
    saved = list(reload._registrations)
    reload.register_reload_callback(lambda new, old: calls.append(new.bot.nickname))
    watcher = reload.ConfigWatcher(config_file, debounce_ms=150).start()
    reads = []  # what the watcher's re-reads of the file returned
    real_reload_from_file = reload.reload_from_file

    def spy(path=None):
        reads.append(real_reload_from_file(path))
        return reads[-1]

    monkeypatch.setattr(reload, "reload_from_file", spy)
    try:
        data = form_data(operator)
        data["bot__nickname"] = "一次 once"
        assert operator.post("/admin/config/", data).status_code == 302
        assert wait_for(lambda: reads, timeout=15)  # the watcher saw the save's write and read the file
    finally:
        watcher.stop()
        reload._registrations[:] = saved
    assert all(r is None for r in reads), reads  # nothing new: the save already applied it
    assert calls == ["一次 once"]
    assert watcher.reloads == 0


def test_a_form_save_keeps_an_edit_made_to_the_file_meanwhile(operator, config_file):
    data = form_data(operator)
    # Someone edits the file by hand while the operator has the form open.
    config_file.write_text(
        config_file.read_text(encoding="utf-8").replace("history_window = 30", "history_window = 99"), encoding="utf-8"
    )
    data["bot__nickname"] = "合并 merged"

    assert operator.post("/admin/config/", data).status_code == 302

    text = config_file.read_text(encoding="utf-8")
    assert 'nickname = "合并 merged"' in text and "history_window = 99" in text
    assert (get_config().bot.nickname, get_config().chat.history_window) == ("合并 merged", 99)


def test_a_raw_save_over_a_file_changed_meanwhile_is_refused_then_allowed_knowingly(operator, config_file):
    data = form_data(operator, "/admin/config/raw/")
    hand_edited = config_file.read_text(encoding="utf-8").replace("history_window = 30", "history_window = 99")
    config_file.write_text(hand_edited, encoding="utf-8")
    data["toml"] = data["toml"].replace("max_rounds = 5", "max_rounds = 8")

    response = operator.post("/admin/config/raw/", data)
    page = response.content.decode()
    assert response.status_code == 200 and "changed on disk" in page
    assert config_file.read_text(encoding="utf-8") == hand_edited
    assert "max_rounds = 8" in page  # the operator's text is still in the box

    again = form_data_from(page)
    assert operator.post("/admin/config/raw/", again).status_code == 302
    assert "max_rounds = 8" in config_file.read_text(encoding="utf-8")


@pytest.fixture
def config_editor(db) -> tuple[Client, User]:
    """Staff who may edit the config but not choose the model provider."""
    staff = User.objects.create_user("editor", password="pw-123456", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="change_config"))
    client = Client()
    client.force_login(staff)
    return client, staff


def test_changing_the_provider_needs_its_own_permission_and_nothing_is_written(config_file, config_editor):
    client, _ = config_editor
    before = config_file.read_text(encoding="utf-8")
    data = form_data(client) | {"llm__base_url": "https://attacker.example/v1"}
    page = client.post("/admin/config/", data).content.decode()
    assert "Can change the model provider" in page
    raw = before.replace('base_url = ""', 'base_url = "https://attacker.example/v1"')
    assert raw != before
    page = client.post("/admin/config/raw/", {"toml": raw, "base_digest": reload.text_digest(before)}).content.decode()
    assert "Can change the model provider" in page
    assert config_file.read_text(encoding="utf-8") == before and get_config().llm.base_url == ""
    # Other keys stay editable for them, and the history says who changed what.
    client.post("/admin/config/", form_data(client) | {"chat__max_rounds": "4"})
    assert get_config().chat.max_rounds == 4
    change = ConfigChange.objects.get()
    assert change.user.username == "editor" and change.changed_keys == ["chat.max_rounds"]


def test_a_provider_change_by_a_superuser_is_recorded_with_who_and_the_old_and_new_values(config_file, operator):
    operator.post("/admin/config/", form_data(operator) | {"llm__base_url": "https://llm.example/v1"})
    assert get_config().llm.base_url == "https://llm.example/v1"
    change = ConfigChange.objects.get()
    assert change.user.username == "op" and change.provider == {"llm.base_url": ["", "https://llm.example/v1"]}


def test_the_key_variable_cannot_name_another_secret_even_for_a_superuser(config_file, operator):
    before = config_file.read_text(encoding="utf-8")
    page = operator.post(
        "/admin/config/", form_data(operator) | {"llm__api_key_env": "DJANGO_SUPERUSER_PASSWORD"}
    ).content.decode()
    assert "MAIBOT_LLM_KEY_ENVS" in page
    assert config_file.read_text(encoding="utf-8") == before and not ConfigChange.objects.exists()
