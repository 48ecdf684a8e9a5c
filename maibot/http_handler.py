"""Django's HTTP side under the ASGI server: each request's whole middleware chain and view run in one
hop, on a bounded pool of threads, each with its own database connection.

Django's own ASGIHandler runs the chain in async mode: every MiddlewareMixin middleware (security,
sessions, locale, CSRF, auth, messages, ...) is one `sync_to_async` hop for its request half and one for
its response half, and the sync view another: about 19 thread hand-offs per request, to a thread asgiref
starts for that request (ThreadSensitiveContext) and joins at its end, with a new database connection
each time. Here the chain is built as under WSGI (sync) and a request is one call on a pool of threads
that live on, as a WSGI server's worker thread would make it.

Invariants:
- A request's middleware and view run in one thread, start to end (thread-local state such as the
  active language, time zone and urlconf is the request's own, as under WSGI).
- A pool thread keeps its database connection from one request to the next, for at most
  POOL_CONNECTION_SECONDS. Before and after each request it is dropped as Django's `request_started` /
  `request_finished` would drop it (errors that left it unusable, autocommit left off: a transaction
  left open, too old); and it is health-checked at its first use in a request (CONN_HEALTH_CHECKS:
  one `SELECT 1` on PostgreSQL, nothing on SQLite), so a database restart costs no request an error.
  Other threads keep the project's CONN_MAX_AGE (0: a connection per request).
- Code in a view that awaits async code (`async_to_sync`) runs it on the server's event loop, as
  before.
- What happens after the view (sending the body, `response.close()` and its `request_finished`) is
  Django's ASGIHandler unchanged.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import django
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler
from django.db import close_old_connections, connections
from django.http import FileResponse, HttpRequest, HttpResponseBase

from core.aio import db

POOL_CONNECTION_SECONDS = 300.0


def _pool_connections_kept() -> None:
    """After a request in a pool thread: a connection opened for it is kept for the next ones (up to
    POOL_CONNECTION_SECONDS, health-checked at its first use in each), then Django's own check drops a
    broken one, or one left out of autocommit (a transaction left open), or one too old."""
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and getattr(conn, "kept_by_http_pool", None) is not conn.connection:
            conn.close_at = time.monotonic() + POOL_CONNECTION_SECONDS
            conn.health_check_enabled = True
            conn.kept_by_http_pool = conn.connection
    close_old_connections()


class PooledASGIHandler(ASGIHandler):
    """ASGIHandler whose middleware chain is sync and runs, with the view, in one hop on `pool`."""

    def __init__(self, threads: int) -> None:
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="http")
        super().__init__()
        self._respond = db(self._served, executor=self.pool)

    def _served(self, request: HttpRequest) -> HttpResponseBase:
        """One request in a pool thread, its connections checked before and settled after."""
        close_old_connections()
        try:
            return self.get_response(request)
        finally:
            _pool_connections_kept()

    def load_middleware(self, is_async: bool = False) -> None:
        """The chain as a WSGI handler builds it: sync middleware around the sync `_get_response`."""
        super().load_middleware(is_async=False)

    async def run_get_response(self, request: HttpRequest) -> HttpResponseBase:
        response = await self._respond(request)
        response._handler_class = self.__class__
        if isinstance(response, FileResponse):  # the ASGI server chunks it: larger blocks, as Django's own
            response.block_size = self.chunk_size
        return response


def get_pooled_asgi_application() -> PooledASGIHandler:
    """Django set up, and its HTTP handler on a pool of settings.HTTP_THREADS (MAIBOT_HTTP_THREADS) threads.
    SQLite in WAL mode lets them read at once and write one after another (IMMEDIATE transactions, busy
    timeout); PostgreSQL serves them in parallel."""
    django.setup(set_prefix=False)
    return PooledASGIHandler(settings.HTTP_THREADS)
