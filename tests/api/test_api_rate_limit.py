"""The per-token rate limit: counted per wall-clock minute in the database (see test_api_live for two
server processes sharing it)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from api import http as api_module
from api.access import api_token_create, rate_limit_hit
from api.models import ApiRateWindow
from chat.models import Message
from core import config as bot_config
from tests.api.support import ApiClient

pytestmark = pytest.mark.django_db


def test_limit_per_minute_then_retry_after_until_the_next_minute(token_pair):
    token, _ = token_pair
    start = datetime(2026, 11, 22, 1, 0, 15, tzinfo=UTC)
    with bot_config.override(api={"rate_limit_per_minute": 3}):
        assert [rate_limit_hit(token=token, now=start + timedelta(seconds=i)) for i in range(3)] == [None] * 3
        assert rate_limit_hit(token=token, now=start + timedelta(seconds=20)) == 25  # 01:00:35 → 01:01:00
        assert rate_limit_hit(token=token, now=start + timedelta(seconds=44.5)) == 1
        # A new minute, a new budget; the old window's row is gone.
        assert rate_limit_hit(token=token, now=start + timedelta(seconds=45)) is None
    assert ApiRateWindow.objects.filter(token=token).count() == 1


def test_429_with_retry_after_and_nothing_sent(api, make_session, token_pair, clock, monkeypatch):
    session = make_session()
    body = {"conversation_id": session.session_id, "text": "x"}
    other = api_token_create(name="other")[1]
    # The window is a wall-clock minute: the throttle counts at the injected clock's instant (second 30
    # of its minute), so no minute turns during the test.
    monkeypatch.setattr(api_module, "rate_limit_hit", lambda *, token: rate_limit_hit(token=token, now=clock()))
    with bot_config.override(api={"rate_limit_per_minute": 2}):
        assert [api.post("/messages", body).status_code for _ in range(2)] == [201, 201]
        resp = api.post("/messages", body)
        assert resp.status_code == 429
        assert resp.json()["code"] == "rate_limited"
        assert 1 <= int(resp["Retry-After"]) <= 60
        assert api.get("/conversations").status_code == 429
        assert ApiClient(other).get("/conversations").status_code == 200
    assert Message.objects.count() == 2
