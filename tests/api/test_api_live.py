"""The proactive API on real daphne servers (and a real qcluster): concurrent idempotent requests,
the rate limit across processes, immediate and scheduled delivery, the docs."""

from __future__ import annotations

import itertools
import json
import threading
import urllib.error
import urllib.request
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from api.access import api_token_create
from api.models import ApiRateWindow
from chat.fate import SENDER_FATE
from chat.models import Message
from scheduling.models import ScheduledMessage
from tests.conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]


def http(method: str, url: str, body: Any = None, headers: dict[str, str] | None = None):
    """(status, headers, json body) of one real HTTP request."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.headers, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, json.loads(exc.read() or b"null")


def server_config(tmp_path: Path, name: str, toml: str) -> None:
    """Write the bot config a server (started with this name) reads from its data dir."""
    data_dir = tmp_path / f"data-{name}"
    data_dir.mkdir(exist_ok=True)
    (data_dir / "bot_config.toml").write_text(toml, encoding="utf-8")


def test_concurrent_requests_with_one_key_on_two_servers_send_one_message(
    shared_server, start_server, make_session, tmp_path
):
    _, base_a = shared_server
    _, base_b = start_server("b")
    _, raw = api_token_create(name="concurrent")
    session = make_session()
    body = {"conversation_id": session.session_id, "text": "并发 concurrent"}
    auth = {"Authorization": f"Bearer {raw}", "Idempotency-Key": "same-key"}
    results: list[tuple[int, Any]] = []
    barrier = threading.Barrier(8)

    def fire(base: str) -> None:
        barrier.wait()
        status, _, payload = http("POST", f"{base}/api/v1/messages", body, auth)
        results.append((status, payload))

    threads = [threading.Thread(target=fire, args=(base_a if i % 2 else base_b,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 8
    assert {status for status, _ in results} == {201}, results
    assert len({json.dumps(payload, sort_keys=True) for _, payload in results}) == 1
    assert ScheduledMessage.objects.count() == 1
    assert Message.objects.filter(session=session).count() == 1


def test_rate_limit_holds_across_two_server_processes(start_server, tmp_path):
    for name in ("a", "b"):
        server_config(tmp_path, name, "[api]\nrate_limit_per_minute = 5\n")
    _, base_a = start_server("a")
    _, base_b = start_server("b")
    token, raw = api_token_create(name="limited")
    _, other = api_token_create(name="unlimited")
    # The servers count per wall-clock minute, which may turn during the burst: after each request the
    # test reads which window it was counted in (the newest row) and at which count, so it knows the
    # answer each request must get, whatever the minute.
    statuses, expected, counts, retry_after = [], [], [], []
    for i in range(8):
        base = base_a if i % 2 else base_b
        status, headers, body = http("GET", f"{base}/api/v1/conversations", headers={"Authorization": f"Bearer {raw}"})
        statuses.append(status)
        window = ApiRateWindow.objects.filter(token=token).latest("window_start")
        counts.append((window.window_start, window.count))
        expected.append(200 if window.count <= 5 else 429)
        if status == 429:
            assert body["code"] == "rate_limited"
            retry_after.append(int(headers["Retry-After"]))
    assert statuses == expected, (statuses, counts)
    # One count shared by both servers: within a window the requests count 1, 2, 3… whichever server.
    for (w1, c1), (w2, c2) in itertools.pairwise(counts):
        assert c2 == (c1 + 1 if w2 == w1 else 1), counts
    if len({w for w, _ in counts}) == 1:  # the usual case: the whole burst in one minute
        assert statuses == [200] * 5 + [429] * 3, statuses
    assert all(1 <= r <= 60 for r in retry_after), retry_after
    # Another token has its own budget.
    status, _, _ = http("GET", f"{base_a}/api/v1/conversations", headers={"Authorization": f"Bearer {other}"})
    assert status == 200


def test_send_now_and_scheduled_through_a_live_server_and_qcluster(shared_server, shared_qcluster, make_session):
    _, base = shared_server
    _, raw = api_token_create(name="live")
    auth = {"Authorization": f"Bearer {raw}"}
    session = make_session(chat_type="group")
    status, _, now_msg = http(
        "POST", f"{base}/api/v1/messages", {"conversation_id": session.session_id, "text": "现在 now"}, auth
    )
    assert status == 201, now_msg
    # In the outbox or already handed over: the status is the fate of that outbound message.
    assert now_msg["delivery"]["status"] in {"pending", "sending", "sent", "failed"}
    assert now_msg["status"] == SENDER_FATE[now_msg["delivery"]["status"]], now_msg
    send_at = timezone.now() + timedelta(seconds=2)
    status, _, later = http(
        "POST",
        f"{base}/api/v1/messages",
        {"conversation_id": session.session_id, "text": "稍后 later", "send_at": send_at.isoformat()},
        auth,
    )
    assert status == 201 and later["status"] == "pending", later

    def written() -> bool:
        return http("GET", f"{base}/api/v1/messages/{later['id']}", headers=auth)[2]["delivery"] is not None

    assert wait_for(written)
    detail = http("GET", f"{base}/api/v1/messages/{later['id']}", headers=auth)[2]
    assert detail["delivery"]["message_id"]
    assert detail["status"] == SENDER_FATE[detail["delivery"]["status"]], detail
    history = list(Message.objects.filter(session=session).values_list("text", "source_kind"))
    assert history == [("现在 now", "proactive"), ("稍后 later", "proactive")]
    task = ScheduledMessage.objects.get(pk=later["id"])
    assert 0 <= task.lateness_seconds < 5.0, task.lateness_seconds

    # Sends now from several clients while the cluster's dispatcher runs: each goes out exactly once.
    answers: list[tuple[int, bool]] = []

    def send(i: int) -> None:
        status, _, body = http(
            "POST", f"{base}/api/v1/messages", {"conversation_id": session.session_id, "text": f"burst {i}"}, auth
        )
        # Each 201 comes once its message is in the outbox, and says what became of that message.
        delivery = body.get("delivery") or {}
        answers.append((status, body.get("status") == SENDER_FATE.get(delivery.get("status"))))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert answers == [(201, True)] * 12, answers
    burst = Message.objects.filter(session=session, text__startswith="burst ")
    assert sorted(burst.values_list("text", flat=True)) == sorted(f"burst {i}" for i in range(12))
    assert ScheduledMessage.objects.filter(status="sent").count() == 14


def test_openapi_and_docs_are_served_without_a_cdn(shared_server):
    _, base = shared_server
    with urllib.request.urlopen(f"{base}/api/v1/openapi.json", timeout=10) as resp:
        schema = json.loads(resp.read())
    assert set(schema["paths"]) == {
        "/api/v1/messages",
        "/api/v1/messages/{message_id}",
        "/api/v1/messages/{message_id}/cancel",
        "/api/v1/conversations",
    }
    assert "bearer" in json.dumps(schema["components"]["securitySchemes"]).lower()
    with urllib.request.urlopen(f"{base}/api/v1/docs", timeout=10) as resp:
        page = resp.read().decode()
    assert "cdn" not in page.lower() and "https://" not in page
    assert "/static/ninja/swagger-ui-bundle.js" in page
