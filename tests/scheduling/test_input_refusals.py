"""Bad input gets a clear answer and changes nothing: unencodable text, blank text and times beyond the
calendar, through the API over HTTP, the admin forms as an operator, and the planner's tool."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.admin.utils import quote
from django.urls import reverse
from django.utils import timezone

from api.access import api_token_create
from chat.components import ToolContext, registry
from chat.models import Message
from scheduling.life.models import Timer
from scheduling.models import ScheduledMessage
from scheduling.services import SYSTEM, scheduled_message_create
from tests.api.support import ApiClient

pytestmark = pytest.mark.django_db

ZERO_WIDTH = "\u200b\u200c\u200d\ufeff \u3000"


@pytest.fixture
def api(db) -> ApiClient:
    return ApiClient(api_token_create(name="refusals")[1])


def _nothing_stored() -> bool:
    return not ScheduledMessage.objects.exists() and not Message.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('{"channel_type": "qq", "channel_user_id": "1", "text": "hi \\ud800"}', "text"),
        (
            '{"channel_type": "qq", "channel_user_id": "1", "type": "rich_text",'
            ' "segments": [{"type": "text", "text": "ok"}, {"type": "text", "text": "\\udfff x"}]}',
            "segments",
        ),
        ('{"channel_type": "qq", "channel_user_id": "1", "text": "nul \\u0000 here"}', "text"),
    ],
)
def test_the_api_refuses_unencodable_text_with_400_naming_the_field(api, body, field):
    resp = api.post("/messages", raw=body.encode())
    assert resp.status_code == 400, resp.content
    assert field in resp.content.decode()
    assert _nothing_stored()


@pytest.mark.parametrize("segments", [False, True])
def test_zero_width_only_text_is_empty_text(api, segments):
    body = {"channel_type": "qq", "channel_user_id": "1"}
    if segments:
        body |= {"type": "rich_text", "segments": [{"type": "text", "text": ZERO_WIDTH}]}
    else:
        body |= {"text": ZERO_WIDTH}
    resp = api.post("/messages", body)
    assert resp.status_code == 400 and resp.json()["code"] == "empty_text", resp.content
    assert _nothing_stored()


def test_the_planner_tool_calls_zero_width_text_empty_and_a_surrogate_invalid(make_session):
    session = make_session()
    tool = registry.get("schedule_private_message")
    send_at = (timezone.now() + timedelta(hours=1)).isoformat()
    blank = tool(ToolContext(session=session), send_at=send_at, message_text=ZERO_WIDTH)
    broken = tool(ToolContext(session=session), send_at=send_at, message_text="a\ud800b")
    assert blank["error"]["code"] == "empty_text"
    assert broken["error"]["code"] == "invalid_text"
    assert not ScheduledMessage.objects.exists()


@pytest.mark.parametrize("value", ["9999-12-31 23:59:59-05:00", "0001-01-01 00:00:00+05:00"])
def test_admin_reschedule_and_edit_with_times_off_the_calendar_are_form_errors(admin_client, make_session, value):
    task = scheduled_message_create(
        session=make_session(), send_at=timezone.now() + timedelta(hours=1), message_text="hi", acted_by=SYSTEM
    ).task
    before = ScheduledMessage.objects.get(pk=task.pk).send_at
    changelist = reverse("admin:scheduling_scheduledmessage_changelist")
    page = admin_client.post(
        changelist,
        {"action": "reschedule_selected", "_selected_action": [task.pk], "apply": "1", "send_at": value},
    )
    assert page.status_code == 200 and "out of range" in page.content.decode()
    edit = admin_client.post(
        reverse("admin:scheduling_scheduledmessage_change", args=[quote(task.pk)]),
        {"message_text": "hi", "send_at": value},
    )
    assert edit.status_code == 200 and "out of range" in edit.content.decode()
    assert ScheduledMessage.objects.get(pk=task.pk).send_at == before


@pytest.mark.parametrize("spec", ["99999999999d", "once:9999-12-31T23:59-05:00", "每十十分钟"])
def test_admin_timer_specs_beyond_the_calendar_are_form_errors(admin_client, spec):
    page = admin_client.post(
        reverse("admin:scheduling_timer_add"), {"spec": spec, "label": "x", "payload": "", "session": ""}
    )
    assert page.status_code == 200 and "errornote" in page.content.decode()
    assert not Timer.objects.exists()
