"""Prompts as named blocks rendered only when sent (`Prompt`), and the registry of them (`PromptManager`).

A Prompt is an ordered set of named blocks. Each block is a template with `{placeholders}`; a
placeholder is filled at render time from the render context or from a construct function of that
name (sync or async, called with the render context). Rendering is non-recursive: text coming out of
a construct function or the context is inserted as it is, so braces in chat messages are harmless.
A block that renders to blank text is dropped. Duplicate names are errors unless `suppress=True`.
"""

from __future__ import annotations

import inspect
import string
from collections.abc import Awaitable, Callable, Iterable, Mapping
from functools import partial
from typing import Any

from core.plans import Plan, Step, run_async, run_sync

ConstructFunction = Callable[[Mapping[str, Any]], "str | Awaitable[str]"]

_formatter = string.Formatter()


class PromptError(Exception):
    """A prompt or block name is duplicated or unknown, or a placeholder has no value."""


def _placeholders(template: str) -> list[str]:
    names = []
    for _literal, field, _spec, _conv in _formatter.parse(template):
        if field is not None:
            if not field.isidentifier():
                raise PromptError(f"placeholder {{{field}}} must be a plain name")
            names.append(field)
    return names


class Prompt:
    def __init__(
        self,
        name: str,
        blocks: Iterable[tuple[str, str]] | Mapping[str, str] = (),
        *,
        construct: Mapping[str, ConstructFunction] | None = None,
        **context: Any,
    ) -> None:
        self.prompt_name = name
        self.content_block: dict[str, str] = {}
        self.construct_function: dict[str, ConstructFunction] = {}
        self.context: dict[str, Any] = dict(context)
        items = blocks.items() if isinstance(blocks, Mapping) else blocks
        for block_name, template in items:
            self.add_text_block(block_name, template)
        for fn_name, func in (construct or {}).items():
            self.add_construct_function(fn_name, func)

    def __repr__(self) -> str:
        return f"<Prompt {self.prompt_name}: {', '.join(self.content_block)}>"

    # --- editing ---------------------------------------------------------------------------------
    def add_text_block(self, block_name: str, template: str, *, suppress: bool = False) -> None:
        if block_name in self.content_block and not suppress:
            raise PromptError(f"prompt {self.prompt_name!r} already has a block {block_name!r}")
        _placeholders(template)  # validate now, not when a user is waiting
        self.content_block[block_name] = template

    def add_construct_function(self, name: str, func: ConstructFunction, *, suppress: bool = False) -> None:
        if name in self.construct_function and not suppress:
            raise PromptError(f"prompt {self.prompt_name!r} already has a construct function {name!r}")
        self.construct_function[name] = func

    def remove_construct_function(self, name: str) -> None:
        if self.construct_function.pop(name, None) is None:
            raise PromptError(f"prompt {self.prompt_name!r} has no construct function {name!r}")

    def add_block(self, prompt_block: Prompt, block_name: str | None = None, *, suppress: bool = False) -> None:
        """Append another prompt's blocks (prefixed `block_name.` when given) and construct functions.
        All or nothing: on a clash nothing is added."""
        blocks = {(f"{block_name}.{n}" if block_name else n): t for n, t in prompt_block.content_block.items()}
        if not suppress:
            clashes = [n for n in blocks if n in self.content_block]
            clashes += [n for n in prompt_block.construct_function if n in self.construct_function]
            if clashes:
                raise PromptError(f"prompt {self.prompt_name!r} already has {', '.join(map(repr, clashes))}")
        for name, template in blocks.items():
            self.add_text_block(name, template, suppress=True)
        for name, func in prompt_block.construct_function.items():
            self.add_construct_function(name, func, suppress=True)

    def remove_block(self, block_name: str) -> None:
        if self.content_block.pop(block_name, None) is None:
            raise PromptError(f"prompt {self.prompt_name!r} has no block {block_name!r}")

    def copy(self, name: str | None = None) -> Prompt:
        other = Prompt(name or self.prompt_name, self.content_block, construct=self.construct_function)
        other.context = dict(self.context)
        return other

    # --- rendering -------------------------------------------------------------------------------
    def _needed(self) -> list[str]:
        seen: dict[str, None] = {}
        for template in self.content_block.values():
            for field in _placeholders(template):
                seen.setdefault(field, None)
        return list(seen)

    def _assemble(self, values: Mapping[str, Any]) -> str:
        parts = []
        for block_name, template in self.content_block.items():
            try:
                text = template.format_map(values)
            except KeyError as exc:
                raise PromptError(f"block {block_name!r} of {self.prompt_name!r} has no value for {exc}") from None
            if text.strip():
                parts.append(text.strip())
        return "\n\n".join(parts)

    def _render(self, context: Mapping[str, Any]) -> Plan[str]:
        ctx = {**self.context, **context}
        values = dict(ctx)
        for field in self._needed():
            if field in self.construct_function:
                out = self.construct_function[field](ctx)
                if inspect.isawaitable(out):
                    out = yield Step(partial(_refuse_async, field, out), partial(_awaited, out))
                values[field] = "" if out is None else str(out)
        return self._assemble(values)

    def render(self, **context: Any) -> str:
        """Render with sync construct functions only (see `arender` for async ones)."""
        return run_sync(self._render(context))

    async def arender(self, **context: Any) -> str:
        return await run_async(self._render(context))


def _refuse_async(field: str, out: Awaitable[Any]) -> None:
    if hasattr(out, "close"):
        out.close()
    raise PromptError(f"construct function {field!r} is async; use arender()")


async def _awaited(out: Awaitable[Any]) -> Any:
    return await out


class PromptManager:
    """Named prompts. System prompts (the planner's own) cannot be removed, only extended."""

    def __init__(self) -> None:
        self._prompts: dict[str, Prompt] = {}
        self._system: set[str] = set()

    def add_prompt(self, name: str, prompt: Prompt, *, system: bool = False) -> Prompt:
        if name in self._prompts:
            raise PromptError(f"prompt {name!r} is already registered")
        self._prompts[name] = prompt
        if system:
            self._system.add(name)
        return prompt

    def add_system_prompt(
        self,
        name: str,
        blocks: Iterable[tuple[str, str]] | Mapping[str, str],
        *,
        construct: Mapping[str, ConstructFunction] | None = None,
    ) -> Prompt:
        """Register the core's own prompt `name` (it cannot be removed)."""
        return self.add_prompt(name, Prompt(name, blocks, construct=construct), system=True)

    def get_prompt(self, name: str) -> Prompt:
        try:
            return self._prompts[name]
        except KeyError:
            raise PromptError(f"no prompt named {name!r}") from None

    def remove_prompt(self, name: str) -> None:
        if name in self._system:
            raise PromptError(f"prompt {name!r} is a system prompt and cannot be removed")
        if self._prompts.pop(name, None) is None:
            raise PromptError(f"no prompt named {name!r}")

    def list_prompts(self) -> list[str]:
        return list(self._prompts)


prompt_manager = PromptManager()
