"""Every label of the console in the operator's language: each admin page (the index, every app's index,
every changelist with rows in it, every add and change form) and the console's own pages, rendered for a
superuser with the browser set to Simplified Chinese, show no English words but the ones that are names
(QQ, API, MCP, identifiers, config keys) or the data we put in; set to English, no Chinese but the data.

The check is of what a reader sees (text, buttons, placeholders, titles, the options of a select), so a
label the catalogs do not know fails, wherever it comes from: a model's name, a column, a filter, a
choice, an action, a help text, a template. test_a_label_left_in_english_is_found proves it can fail."""

from __future__ import annotations

import re
from datetime import timedelta
from html.parser import HTMLParser

import pytest
from django.contrib import admin
from django.contrib.admin.utils import quote
from django.test import Client, RequestFactory
from django.urls import reverse
from django.utils import timezone

pytestmark = [pytest.mark.django_db, pytest.mark.backend_independent]

ZH = "zh-CN,zh;q=0.9"
EN = "en-US,en;q=0.9"
# What is shown as written in both languages: names of things, units, formats, identifiers.
NAMES = {
    "QQ", "API", "MCP", "LLM", "TOML", "ID", "URL", "HTTP", "HTTPS", "JSON", "UTC", "IP", "WebSocket", "NapCat",
    "MaiBot", "maibot", "ms", "stdio", "http", "cron", "Cron", "OpenAI", "Redis", "SDK", "IANA", "BCP", "MB", "KB",
    "CPU", "PNG", "RLIMIT_NPROC", "DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL", "qq", "send", "read_own", "cancel",
    "summary", "utility", "Asia", "Shanghai", "Engine", "IO", "websocket", "ping", "base64", "GET", "POST", "Accept",
    "ZIP",  # GitHub's "Download ZIP" (the plugin install form's help)
}  # fmt: skip
# The data the fixture puts in (user data is shown as written).
DATA = {
    "小红", "闲聊群", "早上好", "晚安", "记得喝水", "喝水提醒", "生日", "她喜欢猫", "测试令牌", "天气", "admin", "op",
    "weather", "invalid", "reply", "timer", "message", "timeout", "planner", "life", "operator", "birthday", "cats",
    "do_nothing", "gpt-4o-mini", "console", "system", "麦麦", "Cost control", "明天早上8点", "10分钟后", "2小时",
    "in 2 hours", "tomorrow 8am",  # examples of what an operator may type, shown as typed
    "<unknown>",  # what django-axes stores for a request without a User-Agent header
}  # fmt: skip
# The data as whole words ("op" is not taken out of "command_operators"), longest first: the same result in
# every run, whatever the set's order.
DATA_WORDS = re.compile(
    "|".join(rf"(?<![A-Za-z0-9_]){re.escape(item)}(?![A-Za-z0-9_])" for item in sorted(DATA, key=len, reverse=True))
)
SKIPPED_TAGS = {"script", "style", "textarea", "code", "pre", "kbd", "samp"}
# An identifier, a path, an address, a number with its unit, a time: never a label.
NOT_WORDS = re.compile(
    r"\w*\*{4,}|https?://\S+|[\w.-]+@[\w.-]+|\b[\w-]+(?:[._/:][\w-]+)+\b|\b\w*_\w*\b|\b[\w-]*\d[\w-]*\b|\[[a-z_]+\]"
)
LATIN_WORD = re.compile(r"[A-Za-z]{2,}")
CJK = re.compile(r"[\u4e00-\u9fff]")


class VisibleText(HTMLParser):
    """The texts a reader sees on a page: text nodes outside scripts, styles and code or data boxes, and the
    placeholders, titles and button captions."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.texts: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in SKIPPED_TAGS:
            self.skipping += 1
        values = dict(attrs)
        for name in ("placeholder", "title", "aria-label"):
            if values.get(name):
                self.texts.append(values[name] or "")
        if tag == "input" and values.get("type") in ("submit", "button") and values.get("value"):
            self.texts.append(values["value"] or "")

    def handle_endtag(self, tag: str) -> None:
        if tag in SKIPPED_TAGS and self.skipping:
            self.skipping -= 1

    def handle_data(self, data: str) -> None:
        if not self.skipping and data.strip():
            self.texts.append(" ".join(data.split()))


def visible_texts(html: str) -> list[str]:
    parser = VisibleText()
    parser.feed(html)
    return parser.texts


def names() -> set[str]:
    """Names shown as written in both languages, plus the config's keys (the editor's labels are the keys
    the operator writes in bot_config.toml)."""
    from core.config import BotConfig

    keys = {key for f in BotConfig.model_fields.values() for key in f.annotation.model_fields}
    return NAMES | keys | set(BotConfig.model_fields)


PHRASE = re.compile(r"[A-Za-z]{2,}[ -][A-Za-z]{2,}")


def english_in(text: str) -> list[str]:
    """The English left in `text` once names, identifiers and data are taken out: any word in a text with
    no Chinese, an English phrase (two words or more) in one with Chinese."""
    text = NOT_WORDS.sub(" ", DATA_WORDS.sub(" ", text))
    words = [w for w in LATIN_WORD.findall(text) if w not in names()]
    if CJK.search(text):
        kept = " ".join(w if w in words else "·" for w in re.findall(r"[A-Za-z]{2,}|[^A-Za-z\s]+", text))
        return PHRASE.findall(kept)
    return words


def untranslated(html: str) -> list[str]:
    return [text for text in visible_texts(html) if english_in(text)]


def chinese(html: str) -> list[str]:
    texts = [DATA_WORDS.sub("", t) for t in visible_texts(html)]
    return [t for t in texts if CJK.search(t) and t not in ("简体中文",)]


# --- the pages, with rows in every list ----------------------------------------------------------------------


@pytest.fixture
def rows(make_session, admin_user):
    """One row (at least) of every model the admin lists, with Chinese data as an operator's would be."""
    from axes.models import AccessAttempt, AccessFailureLog, AccessLog

    from api.models import McpEndpointCall
    from chat.models import AdapterPlatform, ApiToken, LLMCall, Message, PlannerCycle
    from chat.services import message_send
    from core.models import ConfigChange
    from scheduling.life.models import InnerState, MemorySlot, SessionSummary, Timer
    from scheduling.mcp.models import McpServerState
    from scheduling.models import ScheduledMessage
    from scheduling.services import SYSTEM, scheduled_message_create

    now = timezone.now()
    private = make_session(user_id="42", user_nickname="小红")
    make_session("group", group_id="7", group_name="闲聊群")
    Message.objects.create(session=private, direction="in", source_kind="user", text="早上好", time=now, sender_id="42")
    message_send(session=private, text="晚安", source_kind="reply")
    scheduled_message_create(
        session=private, send_at=now + timedelta(hours=2), message_text="记得喝水", acted_by=SYSTEM
    )
    cycle = PlannerCycle.objects.create(
        session=private, started_at=now, action="reply", trigger="message", error="timeout"
    )
    PlannerCycle.objects.create(kind="life", started_at=now, action="do_nothing", trigger="timer")
    LLMCall.objects.create(cycle=cycle, session=private, purpose="planner", task="planner", model="gpt-4o-mini")
    Timer.objects.create(
        label="喝水提醒", spec="every:1h", kind="every", session=private, next_fire=now + timedelta(hours=1),
        created_via="system",
    )  # fmt: skip
    MemorySlot.objects.create(session=private, key="birthday", content="生日", updated_via="life")
    MemorySlot.objects.create(key="cats", content="她喜欢猫", updated_via="operator")
    InnerState.objects.create(text="天气", updated_at=now, updated_by="life")
    SessionSummary.objects.create(session=private, text="天气", refreshed_at=now)
    McpServerState.objects.create(name="weather", process="host:1", transport="stdio", state="ready", calls=3)
    token = ApiToken.objects.create(name="测试令牌", prefix="abcd1234", created_by=admin_user)
    McpEndpointCall.objects.create(token=token, tool="schedule_message", ok=False, error_code="invalid", duration_ms=3)
    AdapterPlatform.objects.create(platform="qq", first_echo_at=now)
    ConfigChange.objects.create(user=admin_user, source="console", changed_keys=["bot.nickname"])
    AccessAttempt.objects.create(username="op", ip_address="203.0.113.9", failures_since_start=1, attempt_time=now)
    AccessFailureLog.objects.create(username="op", ip_address="203.0.113.9", attempt_time=now)
    AccessLog.objects.create(username="op", ip_address="203.0.113.9", attempt_time=now)
    assert ScheduledMessage.objects.exists()
    return private


def admin_pages(session, user) -> list[str]:
    """Every page of the admin an operator can open, for every registered model."""
    pages = ["/admin/", "/admin/password_change/", "/admin/console/", "/admin/config/", "/admin/config/raw/"]
    pages += [
        "/admin/logs/",
        "/admin/models/",
        "/admin/plugins/",
        "/admin/connect/",
        reverse("console-transcript", args=[session.pk]),
    ]
    pages.append(reverse("admin:chat_llmcall_usage"))
    request = RequestFactory().get("/admin/")
    request.user = user
    for model, model_admin in admin.site._registry.items():
        meta = model._meta
        pages.append(reverse("admin:app_list", args=[meta.app_label]))
        pages.append(reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist"))
        if model_admin.has_add_permission(request):
            pages.append(reverse(f"admin:{meta.app_label}_{meta.model_name}_add"))
        first = model.objects.first()
        if first is not None:
            pages.append(reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[quote(first.pk)]))
    return list(dict.fromkeys(pages))


def get(client: Client, url: str, language: str) -> str:
    response = client.get(url, HTTP_ACCEPT_LANGUAGE=language, follow=True)
    assert response.status_code == 200, f"{url}: {response.status_code}"
    return response.content.decode()


# Pages still showing English on a Chinese page (the gaps left, each to be closed and then removed here: the
# test fails both on a new gap and on a gap closed but still listed). Paths with ids written as <id>.
KNOWN_GAPS: set[str] = set()


def test_every_console_page_in_chinese_has_no_english_label(admin_client, admin_user, rows):
    found = {}
    shown = 0
    for url in admin_pages(rows, admin_user):
        html = get(admin_client, url, ZH)
        shown += len(visible_texts(html))
        if bad := untranslated(html):
            found[re.sub(r"/[^/]*\d[^/]*/change/$", "/<id>/change/", url)] = sorted(set(bad))
    assert shown > 2000  # the pages were rendered, with their rows
    new = {url: texts for url, texts in found.items() if url not in KNOWN_GAPS}
    assert not new, "\n".join(f"{url}: {texts}" for url, texts in new.items())
    assert not KNOWN_GAPS - set(found), f"closed, remove from KNOWN_GAPS: {sorted(KNOWN_GAPS - set(found))}"


def test_a_label_left_in_english_is_found(admin_client, admin_user, rows, monkeypatch):
    """The check is not vacuous: one model name left untranslated fails the index page."""
    from chat.models import ChatSession

    assert not untranslated(get(admin_client, "/admin/chat/", ZH))
    monkeypatch.setattr(ChatSession._meta, "verbose_name_plural", "Untranslated sessions")
    assert "Untranslated sessions" in untranslated(get(admin_client, "/admin/chat/", ZH))


def test_every_console_page_in_english_has_no_chinese_label(admin_client, admin_user, rows):
    found = {}
    for url in admin_pages(rows, admin_user):
        if bad := chinese(get(admin_client, url, EN)):
            found[url] = sorted(set(bad))
    assert not found, "\n".join(f"{url}: {texts}" for url, texts in found.items())


def test_permissions_are_offered_in_the_operators_language(admin_client, rows):
    """Django keeps permission names as English rows; the user's and the group's forms name them in the
    browser's language: the default four from the model's name, the project's own through the catalog."""
    from django.contrib.auth.models import Permission
    from django.utils import translation

    from console.permissions import permission_name

    zh = get(admin_client, "/admin/auth/group/add/", ZH)
    assert "聊天 | 消息 | 可重发未确认或发送失败的消息" in zh
    assert "聊天 | 会话 | 可查看会话" in zh
    assert "Can resend" not in zh
    en = get(admin_client, "/admin/auth/group/add/", EN)
    assert "Chat | message | Can resend unconfirmed or failed outbound messages" in en
    # The console's "view_console" is a custom permission of a model with no default ones, not "Can view console".
    with translation.override("zh-hans"):
        assert permission_name(Permission.objects.get(codename="view_console")) == "可查看仪表盘和实时日志"
        unknown = Permission.objects.get(codename="view_console")
        unknown.name = "Can do something no catalog knows"
        assert permission_name(unknown) == "Can do something no catalog knows"
