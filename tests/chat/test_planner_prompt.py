"""Prompt (named blocks, construct functions, rendered only when sent) and PromptManager."""

import pytest

from chat.agent.prompt import Prompt, PromptError, PromptManager, prompt_manager
from chat.planner.prompts import SYSTEM_PROMPT, TURN_PROMPT
from chat.planner.rules import content_as_reply


def test_blocks_render_in_order_with_construct_functions_and_drop_empty_blocks():
    calls = []

    def history(ctx):
        calls.append(ctx["who"])
        return "Alice: hi {not a placeholder}"

    prompt = Prompt(
        "p",
        [("persona", "You are {name}."), ("memory", "{memory}"), ("history", "{history}")],
        construct={"history": history},
    )
    assert calls == []  # nothing is built before rendering
    text = prompt.render(name="麦麦", memory="", who="ctx")
    assert text == "You are 麦麦.\n\nAlice: hi {not a placeholder}"  # inserted text is never re-parsed
    assert calls == ["ctx"]


async def test_async_construct_functions_need_arender():
    async def slow(ctx):
        return "from a coroutine"

    prompt = Prompt("p", [("x", "{x}")], construct={"x": slow})
    assert await prompt.arender() == "from a coroutine"
    with pytest.raises(PromptError, match="async"):
        prompt.render()


def test_duplicate_and_unknown_names_are_errors():
    prompt = Prompt("p", [("a", "A")])
    with pytest.raises(PromptError, match="already has a block 'a'"):
        prompt.add_text_block("a", "again")
    prompt.add_text_block("a", "replaced", suppress=True)
    assert prompt.render() == "replaced"
    prompt.add_construct_function("f", lambda c: "1")
    with pytest.raises(PromptError):
        prompt.add_construct_function("f", lambda c: "2")
    with pytest.raises(PromptError, match="no block 'zz'"):
        prompt.remove_block("zz")
    with pytest.raises(PromptError, match="no value for"):
        Prompt("q", [("b", "{missing}")]).render()
    with pytest.raises(PromptError, match="plain name"):
        Prompt("r", [("c", "{a.b}")])


def test_add_block_merges_another_prompt_and_refuses_clashes():
    base = Prompt("base", [("one", "1")])
    extra = Prompt("extra", [("two", "{two}")], construct={"two": lambda c: "2"})
    base.add_block(extra)
    assert base.render() == "1\n\n2"
    with pytest.raises(PromptError, match="'two'"):
        base.add_block(extra, "again")  # new block names, but the construct function clashes
    assert list(base.content_block) == ["one", "two"]  # all or nothing
    base.add_block(Prompt("more", [("three", "3")]), "extra")
    assert base.render() == "1\n\n2\n\n3" and "extra.three" in base.content_block


def test_manager_registers_once_and_protects_system_prompts():
    manager = PromptManager()
    manager.add_prompt("mine", Prompt("mine"))
    with pytest.raises(PromptError, match="already registered"):
        manager.add_prompt("mine", Prompt("mine"))
    manager.add_prompt("core", Prompt("core"), system=True)
    with pytest.raises(PromptError, match="system prompt"):
        manager.remove_prompt("core")
    manager.remove_prompt("mine")
    assert manager.list_prompts() == ["core"]
    with pytest.raises(PromptError, match="no prompt named"):
        manager.get_prompt("mine")
    # The planner's own prompts are registered as system prompts.
    assert {SYSTEM_PROMPT, TURN_PROMPT} <= set(prompt_manager.list_prompts())
    with pytest.raises(PromptError):
        prompt_manager.remove_prompt(TURN_PROMPT)


@pytest.mark.parametrize(
    ("content", "sent"),
    [
        ("  好的，明天见！ ", "好的，明天见！"),
        ("", None),
        ("   ", None),
        ('{"name": "reply", "arguments": {"text": "hi"}}', None),
        ("<tool_call>reply</tool_call>", None),
        ("```json\n{}\n```", None),
        ("I will call no_reply now", None),
        ("x" * 2001, None),
    ],
)
def test_plain_content_is_sent_only_when_it_reads_as_a_chat_message(content, sent):
    assert content_as_reply(content) == sent
