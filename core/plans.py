"""Logic written once for sync and async callers: a *plan* is a generator that yields the steps that
block and gets their results back; `run_sync` and `run_async` carry it out.

    def _fetch(key) -> Plan[str]:
        row = yield Step(partial(Row.objects.get, key=key))           # sync ORM work
        body = yield Step(partial(http_get, row.url), partial(http_aget, row.url))
        return body.text

    run_sync(_fetch(1))          # in this thread: each step's `run`
    await run_async(_fetch(1))   # each step's `arun` awaited; one without it: `run` in the DB thread

A step's exception is raised inside the plan at its `yield` (a plan catches it as it would a call's),
and so is the cancellation of an async run: the plan may then yield more steps (e.g. to record what
was done) before it lets it go on. Only the steps differ between the two runs; everything the plan
decides, it decides once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from core.aio import db

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Step:
    """One blocking step: `run` from sync code; from async code `arun` awaited, or without one `run`
    in the caller's DB thread (core.aio.db: sync steps are ORM work or code that calls it)."""

    run: Callable[[], Any]
    arun: Callable[[], Awaitable[Any]] | None = None


Plan = Generator[Step, Any, T]


class _Run:
    """One run of a plan: the next step, given the outcome of the last (`result` or `error`)."""

    def __init__(self, plan: Plan[T]) -> None:
        self.plan = plan
        self.result: Any = None
        self.error: BaseException | None = None
        self.value: Any = None

    def next(self) -> Step | None:
        """The plan's next step; None when it returned (its answer in `value`)."""
        try:
            step = self.plan.send(self.result) if self.error is None else self.plan.throw(self.error)
        except StopIteration as done:
            self.value = done.value
            return None
        self.result = self.error = None
        return step

    def settle(self, call: Callable[[], Any]) -> None:
        try:
            self.result = call()
        except BaseException as exc:
            self.error = exc


def run_sync(plan: Plan[T]) -> T:
    """Carry out `plan` in this thread."""
    run = _Run(plan)
    while (step := run.next()) is not None:
        run.settle(step.run)
    return run.value


async def run_async(plan: Plan[T]) -> T:
    """Carry out `plan` from async code."""
    run = _Run(plan)
    while (step := run.next()) is not None:
        try:
            run.result = await (step.arun() if step.arun is not None else db(step.run)())
        except BaseException as exc:
            run.error = exc
    return run.value
