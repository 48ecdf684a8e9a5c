"""The admin login's limit on wrong passwords: django-axes, told who the client is and what to count.

Axes (its authentication backend, signal handlers and middleware; settings in maibot.settings) records
every failed login in the database, so every server process and restart sees the same count. A login is
refused, even with the right password, while either count has reached AXES_FAILURE_LIMIT
(MAIBOT_LOGIN_FAILURE_LIMIT) failures, each within AXES_COOLOFF_TIME (MAIBOT_LOGIN_LOCKOUT_MINUTES) of
the next, until that time has passed since the last of them:

- per client: the address maibot.proxies decided (REMOTE_ADDR; an IPv6 client by its /64), never a
  header axes would read itself, so a forged X-Forwarded-For changes nothing;
- per username, from every address together (a guesser with many addresses), except from an address
  that has logged in as that user before (axes' access log): the operator's usual address is never
  locked out by someone else's guesses at their name, only by its own failures.

Axes checks the count, then the password, then records a failure: concurrent guesses would all pass the
check before the first is counted. So the admin's login form
(SerializedLoginForm) checks one password at a time per client address and per username in each server
process; with several processes at most one more guess per extra process gets through.

Refused attempts are not counted (the lock ends on time however often it is tried), and a successful
login does not clear the count (a staff user could otherwise clear their address's count by logging
in to their own account between guesses at another's). Staff with the axes permissions see and delete
the counts in the admin (Axes > Access attempts); `manage axes_reset_username`, `axes_reset_ip` and
`axes_reset` do it from the shell.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from core.networks import client_block

BY_ADDRESS = "ip_address"
BY_USERNAME = "username"


def client_address(request: HttpRequest) -> str | None:
    """AXES_CLIENT_IP_CALLABLE: the address maibot.proxies decided, by its /64 for IPv6 (None: unknown,
    and every such client shares one count)."""
    return client_block(request.META.get("REMOTE_ADDR"))


def _known_address(username: str | None, address: str | None) -> bool:
    """Whether `username` has logged in from `address` before (axes' access log of logins)."""
    from axes.models import AccessLog

    if not username or address is None:
        return False
    return AccessLog.objects.filter(username=username, ip_address=address).exists()


def lockout_parameters(request_or_attempt: Any, credentials: dict | None = None) -> list[str]:
    """AXES_LOCKOUT_PARAMETERS: what the failures are counted by for this attempt (see the module)."""
    from axes.helpers import get_client_username

    if not isinstance(request_or_attempt, HttpRequest):  # a stored attempt (axes' cache handler only)
        return [BY_ADDRESS, BY_USERNAME]
    username = get_client_username(request_or_attempt, credentials)
    address = getattr(request_or_attempt, "axes_ip_address", None)
    if _known_address(username, address):
        return [BY_ADDRESS]
    return [BY_ADDRESS, BY_USERNAME]


def seconds_locked(request: HttpRequest, credentials: dict | None) -> int:
    """How long this client's login stays refused: until the oldest failures that make a count reach
    the limit are older than the cool-off (0: not locked)."""
    from axes.handlers.proxy import AxesProxyHandler
    from axes.helpers import get_cool_off, get_failure_limit

    limit = get_failure_limit(request, credentials)
    cool_off = get_cool_off(request)
    handler = AxesProxyHandler.get_implementation()  # the database handler (maibot.settings)
    ends = []
    for attempts in handler.get_user_attempts(request, credentials):
        counted = 0
        for when, failures in attempts.order_by("-attempt_time").values_list("attempt_time", "failures_since_start"):
            counted += failures
            if counted >= limit:
                ends.append(when + cool_off)
                break
    if not ends:
        return 0
    return max(0, math.ceil((max(ends) - timezone.now()).total_seconds()))


def locked_message(retry_after: int) -> str:
    minutes = max(1, math.ceil(retry_after / 60))
    return (
        f"Too many failed logins from this address or for this account: logging in is locked for about "
        f"{minutes} min (even with the right password). An operator can lift the lock in Axes > Access "
        "attempts, or with `manage axes_reset_username <name>` on the server."
    )


def lockout_response(request: HttpRequest, *_: Any) -> HttpResponse:
    """AXES_LOCKOUT_CALLABLE: the page a refused login gets (429, Retry-After). Axes passes the
    original response and the credentials in an order that differs between its sync and async paths;
    the credentials it recorded are on the request."""
    retry_after = max(1, seconds_locked(request, getattr(request, "axes_credentials", None)))
    response = render(
        request,
        "admin/maibot/login_locked.html",
        {**admin.site.each_context(request), "title": "Login locked", "message": locked_message(retry_after)},
        status=settings.AXES_HTTP_RESPONSE_CODE,
    )
    response["Retry-After"] = str(retry_after)
    return response


class _KeyedLocks:
    """One lock per key, existing only while someone holds or waits for it (a guesser's many addresses
    and names leave nothing behind)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[tuple[str, str], tuple[threading.Lock, list[int]]] = {}

    @contextlib.contextmanager
    def hold(self, key: tuple[str, str]) -> Iterator[None]:
        with self._guard:
            lock, users = self._locks.setdefault(key, (threading.Lock(), [0]))
            users[0] += 1
        try:
            with lock:
                yield
        finally:
            with self._guard:
                users[0] -= 1
                if not users[0]:
                    del self._locks[key]


_attempts = _KeyedLocks()


@contextlib.contextmanager
def one_at_a_time(address: str | None, username: str | None) -> Iterator[None]:
    """Hold the login checks of this address and this username in this process. Always the address's
    lock first, and at most one of each: no two holders can wait for each other."""
    with _attempts.hold((BY_ADDRESS, address or "")), _attempts.hold((BY_USERNAME, username or "")):
        yield


class SerializedLoginForm(AdminAuthenticationForm):
    """The admin's login form (console.admin sets it): authenticates under `one_at_a_time`, so the
    count axes checks already holds every earlier guess of this client and of this username."""

    def clean(self) -> dict[str, Any]:
        with one_at_a_time(client_address(self.request), self.cleaned_data.get("username")):
            return super().clean()
