"""The ASGI process tunes its garbage collector at its first request (issue #18): the start-up heap is
frozen, so the full collections that 10,000 live runtimes bring no longer walk Django and the apps, and
the young generation is collected every GC_FIRST_THRESHOLD allocations."""

from __future__ import annotations

import gc

import maibot.asgi  # noqa: F401  (everything the server loads before it serves)
from maibot.process import GC_FIRST_THRESHOLD, start_services_on_first_call


async def test_the_first_request_freezes_the_start_up_heap_once():
    threshold = gc.get_threshold()
    try:
        await _first_request_only()
    finally:
        gc.set_threshold(*threshold)  # the rest of this test process keeps CPython's default


async def _first_request_only():
    gc.unfreeze()  # an earlier test's first request may have frozen this process already
    gc.set_threshold(700, 10, 10)
    served = []

    async def app(scope, receive, send) -> None:
        served.append(scope["type"])

    wrapped = start_services_on_first_call(app)
    assert gc.get_freeze_count() == 0
    await wrapped({"type": "http"}, None, None)
    # Django, the apps and their modules: well over 10,000 objects (~140,000 in a server).
    assert gc.get_freeze_count() > 10_000 and served == ["http"]
    assert gc.get_threshold()[0] == GC_FIRST_THRESHOLD

    gc.unfreeze()
    await wrapped({"type": "http"}, None, None)
    assert gc.get_freeze_count() == 0 and served == ["http", "http"]  # the first request only
