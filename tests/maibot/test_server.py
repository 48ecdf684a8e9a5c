"""The ASGI server starts against the test database and serves the admin."""

import urllib.request

import pytest

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]


def test_daphne_serves_the_admin_login(shared_server):
    _, base = shared_server
    with urllib.request.urlopen(f"{base}/admin/login/", timeout=10) as resp:
        body = resp.read().decode()
    assert resp.status == 200
    assert "Django administration" in body or "Log in" in body
