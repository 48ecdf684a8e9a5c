"""Retrying: the one exponential backoff, and the one "the batch failed: do each alone" fallback.

Every doubling delay of the project (a scheduled message's retry, an outbound message's confirm
deadline, a plugin runner's restart) is `backoff`; every batch that must not let one bad item cost the
others (the dispatcher's chunks, the echoes of a round) goes through `batch_or_each`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def backoff(first: float, attempt: int, *, most: float | None = None) -> float:
    """The delay after the `attempt`-th try (counted from 1): `first`, doubling with each further try,
    capped at `most` when given. An attempt below 1 counts as the first."""
    delay = first * 2 ** max(0, attempt - 1)
    return delay if most is None else min(delay, most)


def batch_or_each(
    items: Sequence[T],
    run: Callable[[Sequence[T]], R],
    *,
    failed: Callable[[T, Exception], None],
    logger: logging.Logger,
    message: str,
) -> list[R]:
    """`run(items)` once; if it raises, `message` (with `%d`, the batch's size) is logged with the
    traceback on `logger`, and each item is run alone, `failed(item, exc)` taking the ones that raise
    again. Returns the results of the runs that succeeded (one, or one per item that went through).

    The contract `run` keeps: a run that raises has changed nothing (one transaction), so running its
    items again alone never does anything twice."""
    try:
        return [run(items)]
    except Exception:
        logger.exception(message, len(items))
    done = []
    for item in items:
        try:
            done.append(run([item]))
        except Exception as exc:
            failed(item, exc)
    return done
