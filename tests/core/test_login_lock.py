"""The admin login's limit on wrong passwords (core.login_lock, django-axes), attacked as a password
guesser would: in-process for each rule, then against a real server behind a real reverse proxy (HAProxy,
trusted as MAIBOT_TRUSTED_PROXIES) with forged X-Forwarded-For headers, on both of axes' paths (the
test client runs the middleware synchronously, daphne asynchronously)."""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
import requests
from django.contrib.auth.models import User
from django.test import Client, override_settings

from tests.conftest import ROOT, subprocess_env, wait_for
from tests.maibot.test_behind_proxy import PROXY_SOURCE, EdgeProxy

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "the-right-password-1"
LIMIT = 5  # MAIBOT_LOGIN_FAILURE_LIMIT's default


def login(address: str, username: str, password: str) -> tuple[int, Client]:
    client = Client(REMOTE_ADDR=address)
    response = client.post("/admin/login/", {"username": username, "password": password, "next": "/admin/"})
    return response.status_code, client


def logged_in(client: Client) -> bool:
    return client.get("/admin/").status_code == 200


@pytest.fixture
def accounts() -> None:
    User.objects.create_superuser("op", password=PASSWORD)
    User.objects.create_user("colleague", password=PASSWORD, is_staff=True)


def test_wrong_passwords_from_one_address_lock_it_even_for_the_right_password(accounts):
    statuses = [login("203.0.113.9", "op", f"guess-{i}")[0] for i in range(LIMIT)]
    assert statuses == [200] * (LIMIT - 1) + [429]  # the form again, then the lock on the last one
    client = Client(REMOTE_ADDR="203.0.113.9")
    refused = client.post("/admin/login/", {"username": "op", "password": PASSWORD, "next": "/admin/"})
    assert refused.status_code == 429 and not logged_in(client)
    assert "Too many failed logins" in refused.content.decode() and "about 15 min" in refused.content.decode()
    assert 14 * 60 < int(refused["Retry-After"]) <= 15 * 60
    # Another account from the same address: the address is locked, whoever it claims to be.
    assert login("203.0.113.9", "colleague", PASSWORD)[0] == 429


def test_another_client_logs_in_while_an_address_is_locked(accounts):
    for i in range(LIMIT):
        login("203.0.113.9", "colleague", f"guess-{i}")
    status, client = login("198.51.100.2", "op", PASSWORD)
    assert status == 302 and logged_in(client)


def test_an_ipv6_client_is_counted_by_its_64(accounts):
    for i in range(LIMIT):  # a new address of the same /64 each time
        login(f"2001:db8:7:1::{i + 1}", "colleague", f"guess-{i}")
    assert login("2001:db8:7:1::ff", "op", PASSWORD)[0] == 429
    assert login("2001:db8:7:2::1", "op", PASSWORD)[0] == 302  # the next /64 is someone else


def test_guesses_at_one_name_from_many_addresses_lock_the_name_but_not_its_usual_address(accounts):
    assert login("198.51.100.7", "op", PASSWORD)[0] == 302  # the operator's usual address
    for i in range(LIMIT):  # one guess from each of many addresses: no address reaches the limit
        assert login(f"203.0.113.{20 + i}", "op", f"guess-{i}")[0] == (429 if i == LIMIT - 1 else 200)
    assert login("192.0.2.50", "op", PASSWORD)[0] == 429  # the name is locked from anywhere new
    assert login("192.0.2.50", "colleague", PASSWORD)[0] == 302  # that address itself is not
    status, client = login("198.51.100.7", "op", PASSWORD)
    assert status == 302 and logged_in(client)


def test_the_lock_ends_after_the_window_and_refused_tries_do_not_extend_it(accounts):
    with override_settings(AXES_COOLOFF_TIME=timedelta(seconds=2)):
        for i in range(LIMIT):
            login("203.0.113.9", "op", f"guess-{i}")
        locked_at = time.monotonic()
        tries = []

        def right_password_works() -> bool:
            tries.append(login("203.0.113.9", "op", PASSWORD)[0])
            return tries[-1] == 302

        assert wait_for(right_password_works, timeout=20, interval=0.2)
    assert time.monotonic() - locked_at >= 1.5 and tries[0] == 429 and tries.count(429) >= 3


def test_a_failure_never_counts_another_header_address(accounts):
    """Axes reads no forwarding header of its own: only REMOTE_ADDR (what maibot.proxies decided)."""
    for i in range(LIMIT):
        Client(REMOTE_ADDR="203.0.113.9", HTTP_X_FORWARDED_FOR=f"10.9.8.{i}", HTTP_X_REAL_IP=f"10.9.9.{i}").post(
            "/admin/login/", {"username": "colleague", "password": f"guess-{i}"}
        )
    assert login("203.0.113.9", "op", PASSWORD)[0] == 429


@pytest.mark.parametrize("value", ["0", "-3", "five", "1e9"])
def test_a_bad_limit_in_the_environment_stops_start_up_naming_it(value, tmp_path):
    env = subprocess_env(MAIBOT_DATA_DIR=str(tmp_path), MAIBOT_LOGIN_FAILURE_LIMIT=value)
    checked = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert checked.returncode != 0 and "MAIBOT_LOGIN_FAILURE_LIMIT: a positive whole number" in checked.stderr


# --- through a real server behind a real reverse proxy -------------------------------------------------------


class LoginBrowser:
    """A browser at the admin login (requests, with Django's CSRF cookie), sending `headers` always."""

    def __init__(self, base: str, **headers: str) -> None:
        self.base = base
        self.session = requests.Session()
        self.session.headers.update(headers)

    def login(self, username: str, password: str, **headers: str) -> requests.Response:
        if "csrftoken" not in self.session.cookies:
            self.session.get(f"{self.base}/admin/login/", timeout=30)
        form = {
            "username": username,
            "password": password,
            "next": "/admin/",
            "csrfmiddlewaretoken": self.session.cookies["csrftoken"],
        }
        return self.session.post(
            f"{self.base}/admin/login/", data=form, headers=headers, allow_redirects=False, timeout=60
        )


@pytest.fixture
def server_behind_proxy(start_server, tmp_path):
    """start(window): a real server locking logins for `window` seconds, whose trusted proxy (HAProxy) has
    a front end per client address. Returns (server URL, proxy)."""
    proxies = []

    def start(window: float) -> tuple[str, EdgeProxy]:
        _, base = start_server(
            "login", MAIBOT_TRUSTED_PROXIES=PROXY_SOURCE, MAIBOT_LOGIN_LOCKOUT_MINUTES=str(window / 60)
        )
        clients = {
            "attacker": "203.0.113.5",
            "operator": "203.0.113.6",
            "colleague": "203.0.113.7",
            "travel": "203.0.113.8",
        }
        proxies.append(EdgeProxy(tmp_path, base.removeprefix("http://"), clients))
        return base, proxies[-1]

    yield start
    for proxy in proxies:
        proxy.stop()


@pytest.mark.live
def test_behind_a_trusted_proxy_a_guesser_is_locked_by_its_real_address_whatever_it_forges(
    accounts, server_behind_proxy
):
    window = 10.0  # long enough for the checks that must fall inside it, on a loaded machine
    base, proxy = server_behind_proxy(window)
    # The operator logs in from their usual address once; it is known from then on.
    assert LoginBrowser(proxy.url("operator")).login("op", PASSWORD).status_code == 302

    attacker = LoginBrowser(proxy.url("attacker"))
    for i in range(LIMIT):
        # Claiming another address each time changes nothing: the proxy's own entry is the last one.
        forged = {"X-Forwarded-For": f"203.0.113.6, 10.0.0.{i}", "X-Real-IP": f"10.0.1.{i}"}
        answer = attacker.login("op", f"guess-{i}", **forged)
        assert answer.status_code == (429 if i == LIMIT - 1 else 200), answer.text
    locked_at = time.monotonic()
    refused = attacker.login("op", PASSWORD, **{"X-Forwarded-For": "203.0.113.6"})
    assert refused.status_code == 429 and "Too many failed logins" in refused.text
    assert "sessionid" not in attacker.session.cookies
    # The operator's name is locked from an address never used (checked first: it must be in the window)...
    assert LoginBrowser(proxy.url("travel")).login("op", PASSWORD).status_code == 429
    # ...but others are not locked out by the attacker's address: a colleague with their own account,
    # and the operator from their usual address.
    assert LoginBrowser(proxy.url("colleague")).login("colleague", PASSWORD).status_code == 302
    assert LoginBrowser(proxy.url("operator")).login("op", PASSWORD).status_code == 302

    # Straight to the server (not through the trusted proxy) the client's own header is ignored: the
    # count is the peer's, however the header changes.
    direct = [
        LoginBrowser(base, **{"X-Forwarded-For": f"198.51.100.{i}"}).login("colleague", f"guess-{i}").status_code
        for i in range(LIMIT)
    ]
    assert direct == [200] * (LIMIT - 1) + [429]
    assert LoginBrowser(base, **{"X-Forwarded-For": "198.51.100.99"}).login("colleague", PASSWORD).status_code == 429

    # After the window the attacker's address and the operator's name are free again (the refused tries
    # in between did not extend the lock).
    assert wait_for(lambda: attacker.login("op", PASSWORD).status_code == 302, timeout=window + 20, interval=0.5)
    assert time.monotonic() - locked_at >= window - 1.5
    assert attacker.session.get(f"{proxy.url('attacker')}/admin/", timeout=30).status_code == 200


def _burst(guessers: list[tuple[LoginBrowser, str]]) -> list[int]:
    """Every guesser's wrong password at once (each has its login page already)."""
    for browser, _ in guessers:
        browser.session.get(f"{browser.base}/admin/login/", timeout=30)
    with ThreadPoolExecutor(len(guessers)) as pool:
        return sorted(pool.map(lambda g: g[0].login(g[1], "a-wrong-guess").status_code, guessers))


def _checked(**where: str) -> int:
    """Passwords checked and found wrong: axes' count (tries refused by the lock are not counted)."""
    from axes.models import AccessAttempt

    return sum(AccessAttempt.objects.filter(**where).values_list("failures_since_start", flat=True))


@pytest.mark.live
def test_a_burst_of_concurrent_guesses_gets_no_more_passwords_checked_than_the_limit(accounts, server_behind_proxy):
    _, proxy = server_behind_proxy(120.0)
    # At one name from three addresses (no address reaches the limit alone)...
    fronts = ["attacker", "colleague", "travel"]
    statuses = _burst([(LoginBrowser(proxy.url(fronts[i % 3])), "op") for i in range(4 * LIMIT)])
    assert statuses == [200] * (LIMIT - 1) + [429] * (3 * LIMIT + 1)
    assert _checked(username="op") == LIMIT
    # ...and from one address at many names.
    statuses = _burst([(LoginBrowser(proxy.url("operator")), f"name-{i}") for i in range(4 * LIMIT)])
    assert statuses == [200] * (LIMIT - 1) + [429] * (3 * LIMIT + 1)
    assert _checked(ip_address="203.0.113.6") == LIMIT
    assert LoginBrowser(proxy.url("travel")).login("op", PASSWORD).status_code == 429
    assert LoginBrowser(proxy.url("operator")).login("colleague", PASSWORD).status_code == 429
