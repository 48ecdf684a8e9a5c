"""Should the bot speak now? `decide` and `after_cycle` as plain functions: facts in, decision out; no
database, no event loop, no clock (the look's moment is a fact)."""

from datetime import datetime

import pytest

from chat.models import ChatSession, ChatType, Message
from chat.planner.decision import NEWS, Observed, Step, TalkState, after_cycle, debounce, decide
from core import config

NOON = datetime(2025, 6, 1, 12, 0)
MODEL = {"base_url": "http://127.0.0.1:9/v1", "model": "fake-model"}
BUDGETS = [{"scope": "task", "target": "planner", "daily_tokens": 100}]


def bot_config(**sections: dict) -> config.BotConfig:
    """The tests' config (offline, nickname "Mai" unless changed) with some sections changed."""
    data = config.get_config().model_dump()
    for name, values in {"bot": {"nickname": "Mai", "alias_names": []}, **sections}.items():
        data[name] = {**data[name], **values}
    return config.BotConfig.model_validate(data)


ONLINE = bot_config(llm=MODEL)


def private() -> ChatSession:
    return ChatSession(platform="qq", chat_type=ChatType.PRIVATE, user_id="42")


def group() -> ChatSession:
    return ChatSession(platform="qq", chat_type=ChatType.GROUP, group_id="7")


def said(*texts: str, **fields) -> tuple[Message, ...]:
    return tuple(Message(pk=i, text=text, **fields) for i, text in enumerate(texts, start=1))


def observed(*texts: str, reason: str = NEWS, **facts) -> Observed:
    return Observed(reason=reason, messages=said(*texts), now=facts.pop("now", NOON), **facts)


# --- news settles first ---


def test_a_burst_settles_after_the_debounce_quiet_and_a_stream_after_five_times_that():
    assert debounce(bot_config(chat={"debounce_seconds": 1.5})) == (1.5, 7.5)
    assert debounce(bot_config(chat={"debounce_seconds": 0})) is None  # look at once


# --- nothing to plan ----------------------------------------------------------------------------------


def test_news_with_nothing_plannable_is_skipped_whatever_the_config():
    for cfg in (bot_config(), ONLINE, bot_config(llm={**MODEL, "budgets": BUDGETS})):
        decision = decide(observed(), private(), TalkState(backlog=2), cfg)
        assert decision.step is Step.SKIP and decision.state == TalkState(backlog=2)


@pytest.mark.parametrize("reason", ["proactive", "no_reply_timeout"])
def test_a_requested_turn_runs_without_news_with_its_reason_as_the_trigger(reason):
    decision = decide(observed(reason=reason), group(), TalkState(backlog=1, silent_streak=3), ONLINE)
    assert (decision.step, decision.trigger, decision.messages) == (Step.CYCLE, reason, ())
    assert decision.state == TalkState(backlog=1, silent_streak=3)  # a request is not group chatter


# --- offline mode and the budget ----------------------------------------------------------------------


def test_without_a_model_the_offline_planner_answers_and_knows_about_mentions():
    cfg = bot_config()
    assert cfg.offline
    decision = decide(observed("hello Mai"), group(), TalkState(backlog=3), cfg)
    assert (decision.step, decision.mentioned, decision.over_budget) == (Step.OFFLINE, True, "")
    assert decision.state == TalkState(backlog=3)  # offline answers leave the restraint alone
    assert decide(observed("hello"), group(), TalkState(), cfg).mentioned is False


def test_offline_mode_never_asks_the_budget_even_with_budgets_set():
    decision = decide(observed("hi"), private(), TalkState(), bot_config(llm={"budgets": BUDGETS}))
    assert decision.step is Step.OFFLINE


def test_with_budgets_the_budget_is_asked_once_and_a_spent_one_means_offline():
    cfg = bot_config(llm={**MODEL, "budgets": BUDGETS})
    assert decide(observed("hi"), private(), TalkState(), cfg).step is Step.ASK_BUDGET
    spent = decide(observed("hi", over_budget="the planner's daily cap is reached"), private(), TalkState(), cfg)
    assert (spent.step, spent.over_budget) == (Step.OFFLINE, "the planner's daily cap is reached")
    assert decide(observed("hi", over_budget=""), private(), TalkState(), cfg).step is Step.CYCLE


def test_without_budgets_the_budget_is_never_asked():
    assert decide(observed("hi"), private(), TalkState(), ONLINE).step is Step.CYCLE


# --- commands before the planner ----------------------------------------------------------------------


def test_before_planner_commands_look_first_then_the_rest_is_decided():
    first = decide(observed("/roll", "hi", has_planner_commands=True), private(), TalkState(), ONLINE)
    assert first.step is Step.COMMANDS and [m.text for m in first.messages] == ["/roll", "hi"]
    rest = Observed(reason=NEWS, messages=said("hi"), now=NOON, has_planner_commands=True, commands_ran=True)
    then = decide(rest, private(), TalkState(), ONLINE)
    assert (then.step, then.trigger) == (Step.CYCLE, "1 new message(s)")


def test_news_the_commands_handled_entirely_is_skipped_but_a_request_still_runs():
    done = {"now": NOON, "has_planner_commands": True, "commands_ran": True}
    assert decide(observed(**done), private(), TalkState(), ONLINE).step is Step.SKIP
    assert decide(observed(reason="proactive", **done), private(), TalkState(), ONLINE).step is Step.CYCLE


def test_offline_comes_before_the_commands():
    decision = decide(observed("/roll", has_planner_commands=True), private(), TalkState(), bot_config())
    assert decision.step is Step.OFFLINE


# --- private chats and the group bar ------------------------------------------------------------------


def test_every_private_message_is_planned():
    decision = decide(observed("a", "b"), private(), TalkState(), ONLINE)
    assert (decision.step, decision.trigger, decision.mentioned) == (Step.CYCLE, "2 new message(s)", False)
    assert decision.state == TalkState()


def test_group_chatter_piles_up_below_the_bar_and_is_planned_when_it_reaches_it():
    cfg = bot_config(llm=MODEL, chat={"talk_frequency": 0.5})  # bar: 2 messages
    below = decide(observed("one"), group(), TalkState(), cfg)
    assert (below.step, below.state) == (Step.SKIP, TalkState(backlog=1))
    reached = decide(observed("two"), group(), below.state, cfg)
    assert (reached.step, reached.state, reached.trigger) == (Step.CYCLE, TalkState(backlog=2), "1 new message(s)")


def test_the_bar_doubles_with_each_silent_turn_up_to_sixteen_times():
    cfg = bot_config(llm=MODEL, chat={"talk_frequency": 1.0})
    assert decide(observed("x"), group(), TalkState(backlog=1, silent_streak=1), cfg).step is Step.CYCLE  # 2 >= 2
    assert decide(observed("x"), group(), TalkState(backlog=2, silent_streak=2), cfg).step is Step.SKIP  # 3 < 4
    assert decide(observed("x"), group(), TalkState(backlog=15, silent_streak=9), cfg).step is Step.CYCLE  # 16 >= 16


def test_a_mention_always_plans_and_ends_the_silent_streak_without_counting_as_backlog():
    cfg = bot_config(llm=MODEL, chat={"talk_frequency": 0.0})
    decision = decide(observed("Mai, are you there?"), group(), TalkState(backlog=4, silent_streak=3), cfg)
    assert (decision.step, decision.mentioned) == (Step.CYCLE, True)
    assert decision.state == TalkState(backlog=4, silent_streak=0)


def test_talk_frequency_zero_means_only_when_mentioned():
    cfg = bot_config(llm=MODEL, chat={"talk_frequency": 0.0})
    decision = decide(observed(*["chatter"] * 50), group(), TalkState(backlog=1000), cfg)
    assert (decision.step, decision.state.backlog) == (Step.SKIP, 1050)


@pytest.mark.parametrize(
    ("facts", "fields"),
    [
        ({"bot_message_ids": frozenset({"m1"})}, {"reply_to_platform_id": "m1"}),  # quotes the bot
        ({"bot_account": "10001"}, {}),  # @<someone:10001>: the bot's account
    ],
)
def test_quoting_the_bot_or_naming_its_account_is_a_mention(facts, fields):
    cfg = bot_config(llm=MODEL, chat={"talk_frequency": 0.0})
    look = Observed(reason=NEWS, messages=said("@<someone:10001> look", **fields), now=NOON, **facts)
    assert decide(look, group(), TalkState(), cfg).mentioned is True
    assert decide(observed("@<someone:10001> look"), group(), TalkState(), cfg).mentioned is False


def test_the_talk_rule_in_force_at_the_moment_of_the_look_sets_the_bar():
    quiet = {"start": "00:00", "end": "08:00", "talk_frequency": 0.0}
    cfg = bot_config(llm=MODEL, chat={"talk_frequency": 1.0, "talk_frequency_rules": [quiet]})
    tz = cfg.tzinfo
    at_night = decide(observed("x", now=datetime(2025, 6, 1, 3, 0, tzinfo=tz)), group(), TalkState(), cfg)
    at_noon = decide(observed("x", now=datetime(2025, 6, 1, 12, 0, tzinfo=tz)), group(), TalkState(), cfg)
    assert (at_night.step, at_noon.step) == (Step.SKIP, Step.CYCLE)


# --- after a cycle ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "mentioned", "private_chat", "streak"),
    [
        ("reply", False, False, 0),
        ("send_emoji", False, False, 0),
        ("no_reply", False, False, 3),  # an unaddressed group turn that stayed silent
        ("no_reply", True, False, 2),  # addressed: not restraint
        ("no_reply", False, True, 2),  # private: not restraint
        ("error", False, False, 2),
        ("max_rounds", False, False, 2),
    ],
)
def test_after_a_cycle_the_backlog_is_spent_and_only_silent_group_turns_lengthen_the_streak(
    action, mentioned, private_chat, streak
):
    state, _ = after_cycle(
        TalkState(backlog=5, silent_streak=2), action=action, mentioned=mentioned, private=private_chat, reason=NEWS
    )
    assert state == TalkState(backlog=0, silent_streak=streak)


@pytest.mark.parametrize(
    ("action", "private_chat", "reason", "relook"),
    [
        ("no_reply", True, NEWS, True),
        ("no_reply", True, "no_reply_timeout", False),  # the one look never asks for another
        ("no_reply", True, "proactive", False),
        ("no_reply", False, NEWS, False),
        ("reply", True, NEWS, False),
    ],
)
def test_only_a_silent_private_answer_to_news_asks_for_one_more_look(action, private_chat, reason, relook):
    _, again = after_cycle(TalkState(), action=action, mentioned=False, private=private_chat, reason=reason)
    assert again is relook
