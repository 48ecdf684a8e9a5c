"""MaiBot's command hook points around a plugin's command, in-process with the example plugin
`command_hooks` (real maibot-plugin-sdk): `chat.command.before_execute` reaches a subscribed handler
with MaiBot's kwargs when the command has matched and before it runs, may stop it (the command does not
run and takes the message, as in MaiBot) or change its matched groups; `chat.command.after_execute`
reports the outcome and may let the message go on to the planner. A handler that raises, one that
never finishes, and one that returns a malformed modification: the command still runs, with its own
arguments, and each failure is on the plugin's record (the admin's recent errors)."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import async_to_sync

from chat import events
from chat.commands import run_commands
from chat.events import Point
from plugins.plugin_apis import call_api
from tests.chat.planner_helpers import inbound_store
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

HOOKS = "test.maibot.command-hooks"
CALLER = "test.maibot.api-caller"


def seen(host, what: str) -> list:
    return asyncio.run(call_api(host.records[CALLER], HOOKS, "seen", {"what": what}, 5.0))


def command(session, text: str) -> bool:
    """Offer one message to the commands; whether one took it."""
    message = inbound_store(session=session, text=text, sender_id="42")
    handled, _cycle = async_to_sync(run_commands)(session=session, new_messages=[message])
    return message.pk in handled


def test_before_execute_gets_maibots_kwargs_after_the_match_and_before_the_command(load_plugins, make_session):
    host = load_plugins("command_hooks", "api_caller")
    assert [h.name.rpartition(":")[2] for h in events.handlers(Point.COMMAND_BEFORE_EXECUTE)] == [
        "gate",  # EARLY
        "hanger",  # NORMAL, then by name
        "raiser",
        "malformed",  # LATE
    ]
    session = make_session()
    assert command(session, "hello there") is False  # no command matched: no hook ran
    assert seen(host, "before") == []

    assert command(session, "/roll 20") is True
    assert seen(host, "before") == [
        {
            "text": "/roll 20",
            "command_name": "roll",
            "plugin_id": HOOKS,
            "matched_groups": {"sides": "20"},
            "extra": [],
        }
    ]
    assert seen(host, "roll") == [{"sides": "20"}]
    assert wait_for(
        lambda: (
            seen(host, "after")
            == [{"success": True, "response": "rolled d20", "continue_process": False, "intercept_message_level": 1}]
        )
    )


def test_a_before_hook_stops_the_command_or_changes_its_groups_and_after_lets_the_message_on(
    load_plugins, make_session
):
    host = load_plugins("command_hooks", "api_caller")
    session = make_session()
    assert command(session, "/roll 6 deny") is True  # stopped: not run, and the message is taken
    assert seen(host, "roll") == []
    assert command(session, "/roll 0") is True
    assert seen(host, "roll") == [{"sides": "6"}]  # the hook's groups
    assert command(session, "/roll 4 pass") is False  # after_execute: continue_process → the planner sees it
    assert seen(host, "roll")[-1] == {"sides": "4"}


def test_hostile_hooks_never_stop_the_command_and_each_failure_is_on_the_plugins_record(load_plugins, make_session):
    host = load_plugins("command_hooks", "api_caller")
    session = make_session()
    events.recent_failures.clear()
    assert command(session, "/roll 8 boom") is True
    assert command(session, "/roll 10 hang") is True
    assert command(session, "/roll 12 bad") is True
    assert seen(host, "roll") == [{"sides": "8"}, {"sides": "10"}, {"sides": "12"}]  # their own groups
    failures = {f.handler.rpartition(":")[2]: f.error for f in events.recent_failures}
    assert failures["raiser"] == "RuntimeError: the gate broke"
    assert failures["hanger"] == "PluginCallTimeout: did not finish within 0.3s"
    assert failures["malformed"] == "modified_kwargs['matched_groups'] is str; ignored"
    errors = host.records[HOOKS].recent_errors
    assert any(e.endswith("HOOK_HANDLER raiser: RuntimeError: the gate broke") for e in errors)
    assert any("HOOK_HANDLER hanger:" in e and "did not finish within" in e for e in errors)
    assert any(e.endswith("HOOK_HANDLER malformed: modified_kwargs['matched_groups'] is str; ignored") for e in errors)
    assert len(errors) == 3
