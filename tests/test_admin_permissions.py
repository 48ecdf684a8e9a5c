"""Every admin action declares the permission it needs: a staff user who may only *view* gets none of
them, and posting one anyway changes nothing. A new action on a model without a factory here fails
the walk, so no action escapes it."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.apps import apps
from django.contrib import admin
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth.models import Permission, User
from django.forms.models import model_to_dict
from django.test import RequestFactory
from django.urls import reverse
from django.utils import timezone
from django_q.models import Failure, Success, Task

from api.access import api_token_create
from chat.models import ApiToken, DeliveryStatus, Message, SourceKind
from chat.services import message_send
from scheduling.life.models import Timer
from scheduling.life.timers import timer_create
from scheduling.models import ScheduledMessage
from scheduling.services import SYSTEM, scheduled_message_create

pytestmark = pytest.mark.django_db


def _scheduled_message(make_session):
    return scheduled_message_create(
        session=make_session(), send_at=timezone.now() + timedelta(hours=1), message_text="hi", acted_by=SYSTEM
    ).task


def _timer(make_session):
    return timer_create(spec="every:1h", label="tick", payload="", session=make_session(), acted_by=SYSTEM)


def _failed_message(make_session):
    # Resendable: what the resend action would put back in the outbox if it ran.
    message = message_send(session=make_session(), source_kind=SourceKind.REPLY, text="lost")
    Message.objects.filter(pk=message.pk).update(delivery_status=DeliveryStatus.FAILED, delivery_error="x")
    return message


def _api_token(make_session):
    return api_token_create(name="partner")[0]


def _task(success: bool):
    def make(make_session):
        now = timezone.now()
        return Task.objects.create(
            id=uuid.uuid4().hex,
            name=f"task-{success}",
            func="math.floor",
            args=(1.5,),
            started=now,
            stopped=now,
            success=success,
        )

    return make


def _expired_login_attempt(make_session):
    # Older than the lock-out window: what the clean-up action would delete if it ran.
    attempt = AccessAttempt.objects.create(
        username="op", ip_address="203.0.113.1", user_agent="guesser", http_accept="*/*",
        path_info="/admin/login/", get_data="", post_data="", failures_since_start=3,
    )  # fmt: skip
    AccessAttempt.objects.filter(pk=attempt.pk).update(attempt_time=timezone.now() - timedelta(days=1))
    return attempt


FACTORIES = {
    ScheduledMessage: _scheduled_message,
    Timer: _timer,
    ApiToken: _api_token,
    Message: _failed_message,
    Success: _task(True),
    Failure: _task(False),
    AccessAttempt: _expired_login_attempt,
}


def _row_counts() -> dict[str, int]:
    tables = [m for m in apps.get_models() if m._meta.managed and not m._meta.proxy]
    return {model._meta.label: model.objects.count() for model in tables}


def _request(user):
    request = RequestFactory().get("/admin/")
    request.user = user
    return request


def _actions_for(user) -> dict[type, list[str]]:
    found = {}
    for model, model_admin in admin.site._registry.items():
        names = [name for name in model_admin.get_actions(_request(user)) if name != "delete_selected"]
        if names:
            found[model] = names
    return found


@pytest.fixture
def viewer(db):
    """Staff with every view permission and nothing else."""
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__startswith="view_"))
    return User.objects.get(pk=user.pk)  # fresh: permission cache empty


def test_a_view_only_user_is_offered_no_action_and_posting_one_changes_nothing(
    admin_user, viewer, client, make_session
):
    everyone_elses = _actions_for(admin_user)
    # The walk must cover the actions that exist: today scheduled messages, timers, API tokens, messages.
    assert {ScheduledMessage, Timer, ApiToken, Message} <= set(everyone_elses)
    assert set(everyone_elses) <= set(FACTORIES), "an admin action on a model this test cannot build"
    assert _actions_for(viewer) == {}

    client.force_login(viewer)
    for model, names in everyone_elses.items():
        obj = FACTORIES[model](make_session)
        before, rows = model_to_dict(model.objects.get(pk=obj.pk)), _row_counts()
        changelist = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
        for name in names:
            response = client.post(
                changelist, {"action": name, ACTION_CHECKBOX_NAME: [obj.pk], "index": 0, "apply": "1"}, follow=True
            )
            assert response.status_code in (200, 403), (model, name)
            assert model_to_dict(model.objects.get(pk=obj.pk)) == before, f"{model.__name__}.{name} ran for a viewer"
            assert _row_counts() == rows, f"{model.__name__}.{name} wrote rows for a viewer"


@pytest.mark.parametrize(
    ("model", "action", "permission"),
    [
        (ScheduledMessage, "send_now_selected", "scheduling.send_now_scheduledmessage"),
        (Timer, "fire_now_selected", "scheduling.fire_timer"),
        (ApiToken, "revoke", "chat.revoke_apitoken"),
        (Message, "resend_selected", "chat.resend_message"),
        (ScheduledMessage, "resend_selected", "chat.resend_message"),
        (Failure, "resubmit_task", "django_q.change_failure"),
    ],
)
def test_the_custom_permissions_grant_exactly_their_action(viewer, model, action, permission):
    app_label, codename = permission.split(".")
    viewer.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    viewer = User.objects.get(pk=viewer.pk)
    assert list(admin.site._registry[model].get_actions(_request(viewer))) == [action]


# --- the Plugins page's actions (a custom admin page, not ModelAdmin actions) --------------------------

PLUGIN_ACTIONS = {
    "disable": "plugins.disable_plugin",
    "enable": "plugins.enable_plugin",
    "reload": "plugins.reload_plugin",
    "install-deps": "plugins.install_plugin_dependencies",
    "config": "plugins.change_plugin_config",
}


@pytest.fixture
def plugin_host_with_one_plugin(tmp_path, monkeypatch):
    from plugins import host as plugin_host
    from tests.plugins.conftest import copy_plugins

    host = plugin_host.PluginHost()
    host.load_all(copy_plugins(tmp_path / "plugins", "unruly"))
    monkeypatch.setattr(plugin_host, "host", host)
    yield host
    host.stop()


def _post_plugin_action(client, action: str):
    url = (
        "/admin/plugins/test.maibot.unruly/config/"
        if action == "config"
        else f"/admin/plugins/test.maibot.unruly/{action}/"
    )
    data = {"toml": '[plugin]\nconfig_version = "1.0.0"\nenabled = true\n[mood]\nword = "changed"\n'}
    return client.post(url, data if action == "config" else {})


@pytest.mark.django_db(transaction=True)
def test_a_view_only_user_can_take_no_plugin_action(plugin_host_with_one_plugin, viewer, client):
    host = plugin_host_with_one_plugin
    record = host.records["test.maibot.unruly"]
    config_text, pid = (record.folder / "config.toml").read_text(), record.runner_pid
    client.force_login(viewer)
    page = client.get("/admin/plugins/").content.decode()
    assert "test.maibot.unruly" in page and 'name="action"' not in page and "config.toml</a>" not in page
    for action in PLUGIN_ACTIONS:
        assert _post_plugin_action(client, action).status_code == 403, action
    assert client.get("/admin/plugins/test.maibot.unruly/config/").status_code == 403
    assert (record.folder / "config.toml").read_text() == config_text
    assert record.runner_pid == pid and record.state == "loaded"


@pytest.mark.django_db(transaction=True)
def test_each_plugin_permission_grants_exactly_its_action(plugin_host_with_one_plugin, viewer, client):
    host = plugin_host_with_one_plugin
    record = host.records["test.maibot.unruly"]
    client.force_login(viewer)
    for action, permission in PLUGIN_ACTIONS.items():
        viewer.user_permissions.set(
            [
                *Permission.objects.filter(codename__startswith="view_"),
                Permission.objects.get(content_type__app_label="plugins", codename=permission.split(".")[1]),
            ]
        )
        for other in PLUGIN_ACTIONS:
            if other != action:
                assert _post_plugin_action(client, other).status_code == 403, (action, other)
        assert _post_plugin_action(client, action).status_code == 302, action
        expected = {"disable": "disabled", "enable": "loaded", "reload": "loaded", "install-deps": "loaded"}
        assert record.state == expected.get(action, "loaded"), (action, record.reason)
    assert record.config["mood"]["word"] == "changed"
