"""The gate of the single file's first-run set-up: the one-time code in the data dir, the limit on wrong
codes, and the middleware that leads every page to /setup/ while it is pending (the page: console.setup).

`maibot` (maibot.pyz) starting on a data dir with no operator account writes a one-time code into the data
dir (`setup-code`, 72 random bits) and prints it. The set-up is pending while that file exists and no
operator account (a superuser, however it was made: this page, `manage createsuperuser`, bootstrap, the
shell) exists; the first look that finds an operator removes the file, so the gate never opens again.
While pending, every page leads to /setup/.

Every use of the page (the form and the model *Test*) needs the code, from any address: behind a reverse
proxy on the same host every client may look like loopback (maibot.proxies). Wrong codes are counted in
the data dir (`setup-attempts.json`, under a file lock, so every process and restart sees the same
count): MAX_FAILURES_PER_CLIENT within FAILURE_WINDOW lock that client out (an IPv6 client by its /64),
MAX_FAILURES in all lock everyone out, until the window has passed; while locked even the right code is
refused. Completing the set-up happens under the same lock and checks again that it is pending, so two
concurrent completions make one operator. `make run` and the tests never write the code, so they never
see the page.
"""

from __future__ import annotations

import contextlib
import fcntl
import hmac
import json
import logging
import os
import secrets
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.utils.decorators import sync_and_async_middleware

from core.aio import db
from core.hosts import SETUP_CODE_FILE
from core.networks import client_block

logger = logging.getLogger(__name__)

CODE_FILE = SETUP_CODE_FILE
ATTEMPTS_FILE = "setup-attempts.json"
LOCK_FILE = "setup.lock"
SETUP_PATH = "/setup/"
# Pages a browser opens; the API, adapters, static files and /healthz keep working during set-up.
GATED_PREFIXES = ("/admin/", "/chat/")
# Wrong codes: a client may try this many within the window, everyone together this many. With 72 bits
# of code, guessing at the global rate would take longer than the universe has existed; the per-client
# limit keeps one client from locking the operator out alone.
FAILURE_WINDOW = 15 * 60.0
MAX_FAILURES_PER_CLIENT = 5
MAX_FAILURES = 50


def _data_path(name: str) -> Path:
    return Path(settings.DATA_DIR) / name


def code_path() -> Path:
    return _data_path(CODE_FILE)


def operator_exists() -> bool:
    """Whether an operator account (a superuser) exists, however it was created. A staff account alone
    does not count: it can only be given rights by a superuser, and the set-up exists to make one."""
    from django.contrib.auth import get_user_model

    return get_user_model().objects.filter(is_superuser=True).exists()


def close() -> None:
    """End the set-up for good: the code and the attempt count are removed."""
    for name in (CODE_FILE, ATTEMPTS_FILE):
        _data_path(name).unlink(missing_ok=True)


def setup_pending() -> bool:
    """The code file exists and no operator does (if one does, the set-up is closed here and now)."""
    if not code_path().exists():
        return False
    if operator_exists():
        close()
        logger.info("an operator account exists: the set-up page is closed")
        return False
    return True


def issue_code() -> str:
    """The one-time code for this set-up (kept across restarts until the set-up is done)."""
    path = code_path()
    if path.exists():
        return path.read_text(encoding="utf-8").strip()
    code = secrets.token_urlsafe(9)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another start wrote one meanwhile: that one holds
        return path.read_text(encoding="utf-8").strip()
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(code + "\n")
    return code


@contextlib.contextmanager
def exclusive() -> Iterator[None]:
    """The set-up's lock across every process on this data dir (checking a code, completing the set-up)."""
    fd = os.open(_data_path(LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def client_key(address: str | None) -> str:
    """Whose wrong codes these are: the address (an IPv6 address by its /64: core.networks.client_block);
    a request whose client is unknown shares one key with all such requests."""
    return client_block(address) or "unknown"


@dataclass(frozen=True)
class CodeCheck:
    """The outcome of one code attempt: right, or wrong; `retry_after` > 0 when refused because of the
    lock-out (then the code was not even compared)."""

    ok: bool
    retry_after: int = 0


def _read_failures(now: float) -> list[tuple[float, str]]:
    try:
        raw = json.loads(_data_path(ATTEMPTS_FILE).read_text(encoding="utf-8"))
        failures = [(float(when), str(key)) for when, key in raw["failures"]]
    except FileNotFoundError:
        return []
    except (ValueError, KeyError, TypeError) as exc:
        # Written atomically, so only a hand edit breaks it; starting the count afresh keeps the
        # per-client and global limits, it only forgets the last window's failures.
        logger.error("%s is unreadable (%s): the count of wrong set-up codes starts again", ATTEMPTS_FILE, exc)
        return []
    return [(when, key) for when, key in failures if now - FAILURE_WINDOW < when <= now]


def _write_failures(failures: list[tuple[float, str]]) -> None:
    path = _data_path(ATTEMPTS_FILE)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".setup-attempts-")  # mkstemp: mode 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"failures": failures}, fh)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _locked_for(times: list[float], limit: int, now: float) -> float:
    """Seconds until fewer than `limit` of these failures lie within the window (0: not locked)."""
    if len(times) < limit:
        return 0.0
    return sorted(times)[len(times) - limit] + FAILURE_WINDOW - now


def code_attempt(given: str, *, client: str | None) -> CodeCheck:
    """Check a code someone typed, counting it if wrong (see the module for the limits; no code at all
    is no guess and is not counted)."""
    key = client_key(client)
    given = given.strip()
    with exclusive():
        now = time.time()
        failures = _read_failures(now)
        wait = max(
            _locked_for([when for when, k in failures if k == key], MAX_FAILURES_PER_CLIENT, now),
            _locked_for([when for when, _ in failures], MAX_FAILURES, now),
        )
        if wait > 0:
            return CodeCheck(ok=False, retry_after=max(1, int(wait + 0.999)))
        try:
            expected = code_path().read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return CodeCheck(ok=False)
        if not given:
            return CodeCheck(ok=False)
        if hmac.compare_digest(given.encode(), expected.encode()):
            return CodeCheck(ok=True)
        failures.append((now, key))
        _write_failures(failures)
    logger.warning("set-up page: wrong one-time code from %s", client or "an unknown client")
    return CodeCheck(ok=False)


def _gated_page(request: HttpRequest) -> bool:
    return request.path == "/" or request.path.startswith(GATED_PREFIXES)


@sync_and_async_middleware
def setup_middleware(get_response):
    """While the set-up is pending, pages lead to it. Afterwards it costs one stat per page request (the
    database is asked only while the code file exists). Async under daphne, sync under the test client."""
    if iscoroutinefunction(get_response):

        async def middleware(request: HttpRequest) -> HttpResponse:
            gated = _gated_page(request) and code_path().exists() and await db(setup_pending)()
            return redirect(SETUP_PATH) if gated else await get_response(request)

    else:

        def middleware(request: HttpRequest) -> HttpResponse:
            gated = _gated_page(request) and setup_pending()
            return redirect(SETUP_PATH) if gated else get_response(request)

    return middleware
