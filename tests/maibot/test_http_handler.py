"""maibot.http_handler: a request's middleware and view run in one thread of the HTTP pool (not the event
loop's, not asgiref's one thread-sensitive thread), requests run side by side up to the pool's size, and a
pool thread keeps its database connection for the next request until it is too old, and one the database
ended (PostgreSQL) is replaced before a request uses it. Through the real PooledASGIHandler, called as an
ASGI server calls it."""

from __future__ import annotations

import asyncio
import threading

import pytest
from asgiref.sync import sync_to_async
from channels.testing import HttpCommunicator
from django.db import connection
from django.http import HttpResponse, JsonResponse
from django.urls import path

from maibot.http_handler import PooledASGIHandler

pytestmark = pytest.mark.django_db(transaction=True)

seen: list[dict] = []
together = threading.Barrier(3, timeout=10)


def where(request):
    seen.append({"thread": threading.current_thread().name, "middleware_thread": request.middleware_thread})
    with connection.cursor() as cursor:  # the thread's own connection
        cursor.execute("SELECT 1")
    pid = connection.connection.info.backend_pid if connection.vendor == "postgresql" else None
    return JsonResponse({"thread": threading.current_thread().name, "pid": pid})


def wait_for_the_others(request):
    together.wait()  # three requests at once, or a BrokenBarrierError after 10 s
    return HttpResponse("together")


def raises(request):
    raise RuntimeError("a view that fails")


urlpatterns = [
    path("where", where),
    path("together", wait_for_the_others),
    path("raises", raises),
]


def note_thread(get_response):
    def middleware(request):
        request.middleware_thread = threading.current_thread().name
        return get_response(request)

    return middleware


@pytest.fixture
def make_handler(settings):
    settings.ROOT_URLCONF = __name__
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, f"{__name__}.note_thread"]
    seen.clear()
    together.reset()
    made = []

    def make(threads: int) -> PooledASGIHandler:
        made.append(PooledASGIHandler(threads=threads))
        return made[-1]

    yield make
    for app in made:
        app.pool.submit(lambda: connection.close()).result()  # each thread's own (threads=1 where it matters)
        app.pool.shutdown(wait=True)


@pytest.fixture
def handler(make_handler):
    return make_handler(3)


async def get(app, url: str) -> tuple[int, bytes]:
    """One GET through the handler, as an ASGI server calls it (Channels' HttpCommunicator)."""
    communicator = HttpCommunicator(app, "GET", url, headers=[(b"host", b"127.0.0.1")])
    try:
        response = await communicator.get_response(timeout=30)
    finally:
        await communicator.wait()
    return response["status"], response["body"]


async def test_middleware_and_view_run_in_one_pool_thread_never_the_loops_or_the_shared_db_thread(handler):
    loop_thread = threading.current_thread().name
    shared_db_thread = await sync_to_async(lambda: threading.current_thread().name, thread_sensitive=True)()
    for _ in range(5):
        status, _body = await get(handler, "/where")
        assert status == 200
    assert len(seen) == 5
    for one in seen:
        assert one["thread"] == one["middleware_thread"], one  # one hop: the chain and the view together
        assert one["thread"].startswith("http") and one["thread"] not in (loop_thread, shared_db_thread), one


async def test_requests_run_side_by_side_up_to_the_pools_size(handler):
    answers = await asyncio.gather(*(get(handler, "/together") for _ in range(3)))
    assert answers == [(200, b"together")] * 3  # each waited for the other two: all three at once


async def test_a_pool_thread_keeps_its_connection_until_it_is_too_old(make_handler, monkeypatch):
    from django.db.backends.signals import connection_created

    from maibot import http_handler

    opened: list[str] = []

    def count(sender, connection, **kwargs) -> None:
        opened.append(threading.current_thread().name)

    connection_created.connect(count)
    try:
        app = make_handler(1)
        for _ in range(3):
            assert (await get(app, "/where"))[0] == 200
        assert len(opened) == 1 and opened[0].startswith("http")  # opened once, kept
        app.pool.submit(lambda: connection.close()).result()
        monkeypatch.setattr(http_handler, "POOL_CONNECTION_SECONDS", 0.0)
        for _ in range(3):
            assert (await get(app, "/where"))[0] == 200
        assert len(opened) == 4  # too old at once: one per request
    finally:
        connection_created.disconnect(count)


async def test_a_connection_the_database_killed_is_replaced_before_the_request_uses_it(make_handler):
    import json

    if connection.vendor != "postgresql":
        pytest.skip("SQLite's connections are files: no server ends them")
    app = make_handler(1)
    pid = json.loads((await get(app, "/where"))[1])["pid"]

    def kill() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])

    await sync_to_async(kill)()
    status, body = await get(app, "/where")  # as after a database restart: no error for this request
    assert status == 200 and json.loads(body)["pid"] != pid


async def test_a_failing_view_is_a_500_and_the_thread_serves_the_next_request(handler):
    status, _body = await get(handler, "/raises")
    assert status == 500
    assert (await get(handler, "/where"))[0] == 200


@pytest.mark.parametrize("value", ["0", "65", "many", "2.5"])
def test_a_bad_pool_size_stops_start_up_naming_it(value):
    import subprocess
    import sys

    from tests.conftest import ROOT, subprocess_env

    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        env={**subprocess_env(), "DJANGO_SETTINGS_MODULE": "maibot.settings", "MAIBOT_HTTP_THREADS": value},
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0 and "MAIBOT_HTTP_THREADS" in result.stderr, result.stderr[-500:]
