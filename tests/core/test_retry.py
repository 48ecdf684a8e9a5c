"""core.retry: the one backoff, and the one "the batch failed: each alone" fallback."""

from __future__ import annotations

import logging

from core.retry import backoff, batch_or_each


def test_backoff_doubles_from_the_first_delay_and_stops_at_its_cap():
    assert [backoff(1.5, n) for n in (0, 1, 2, 3, 4)] == [1.5, 1.5, 3.0, 6.0, 12.0]
    assert [backoff(1, n, most=30) for n in (5, 6, 7)] == [16, 30, 30]


def test_a_failed_batch_is_run_item_by_item_and_only_the_bad_items_fail(caplog):
    runs, failed = [], []

    def run(items):
        runs.append(list(items))
        if "bad" in items:
            raise ValueError("bad item")
        return list(items)

    done = batch_or_each(
        ["a", "bad", "b"],
        run,
        failed=lambda item, exc: failed.append((item, str(exc))),
        logger=logging.getLogger("test"),
        message="batch of %d failed",
    )

    assert done == [["a"], ["b"]]
    assert failed == [("bad", "bad item")]
    assert runs == [["a", "bad", "b"], ["a"], ["bad"], ["b"]]
    assert "batch of 3 failed" in caplog.text


def test_a_batch_that_goes_through_runs_once():
    assert batch_or_each([1, 2], sum, failed=None, logger=logging.getLogger("test"), message="%d") == [3]
