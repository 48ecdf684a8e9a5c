"""The gate of the single file's first-run set-up: the one-time code in the data dir and the middleware that
leads every page to /setup/ while it is pending (the page itself: console.setup).

`maibot` (maibot.pyz) starting on a data dir with no operator account writes a one-time code into the data
dir (`setup-code`) and prints it. While that file exists, every page leads to /setup/; the page is open to
loopback browsers, and to others only with the code. Completing it creates the operator (logged in at
once), saves the bot's settings through the config's one write path, keeps the key and the adapter token in
the data dir (maibot.deployment_env) and removes the code: the gate is gone for good. `make run` and the
tests never write the code, so they never see the page.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
from pathlib import Path

from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.utils.decorators import sync_and_async_middleware

CODE_FILE = "setup-code"
SETUP_PATH = "/setup/"
# Pages a browser opens; the API, adapters, static files and /healthz keep working during set-up.
GATED_PREFIXES = ("/admin/", "/chat/")


def code_path() -> Path:
    return Path(settings.DATA_DIR) / CODE_FILE


def setup_pending() -> bool:
    return code_path().exists()


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


def from_loopback(request: HttpRequest) -> bool:
    try:
        return ipaddress.ip_address(request.META.get("REMOTE_ADDR", "")).is_loopback
    except ValueError:
        return False


def code_ok(given: str) -> bool:
    try:
        expected = code_path().read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return False
    return bool(given) and hmac.compare_digest(given.strip().encode(), expected.encode())


def _gated(request: HttpRequest) -> bool:
    path = request.path
    return (path == "/" or path.startswith(GATED_PREFIXES)) and setup_pending()


@sync_and_async_middleware
def setup_middleware(get_response):
    """While the set-up is pending, pages lead to it; afterwards it costs one stat per page request.
    Async under daphne (no thread hop for every request), sync under the test client."""
    if iscoroutinefunction(get_response):

        async def middleware(request: HttpRequest) -> HttpResponse:
            return redirect(SETUP_PATH) if _gated(request) else await get_response(request)

    else:

        def middleware(request: HttpRequest) -> HttpResponse:
            return redirect(SETUP_PATH) if _gated(request) else get_response(request)

    return middleware
