"""The live-log websocket in-process: bad frames get an error frame, the socket stays open, and
nothing logs a traceback for client input."""

from __future__ import annotations

import logging

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User

from console.consumers import LogStreamConsumer

pytestmark = pytest.mark.django_db(transaction=True)


@database_sync_to_async
def _operator() -> User:
    return User.objects.create_superuser("op", password="pw")


@pytest.mark.parametrize(
    "frame",
    ['["level", 40]', "not json at all", "[" * 100_000 + "]" * 100_000, '"a string"', "1e999999"],
)
async def test_a_bad_frame_gets_an_error_frame_and_the_socket_stays_open(frame, caplog):
    communicator = WebsocketCommunicator(LogStreamConsumer.as_asgi(), "/ws/admin/logs/")
    communicator.scope["user"] = await _operator()
    connected, _ = await communicator.connect()
    assert connected
    first = await communicator.receive_json_from(timeout=5)
    assert first["type"] == "lines" and first["reset"] is True
    with caplog.at_level(logging.WARNING):
        await communicator.send_to(text_data=frame)
        answer = await communicator.receive_json_from(timeout=5)
    assert answer["type"] == "error" and answer["message"]
    assert not any(record.exc_info for record in caplog.records)
    # Still open and still serving: a good frame is answered as usual.
    await communicator.send_json_to({"type": "level", "min_level": 40})
    again = await communicator.receive_json_from(timeout=5)
    assert again["type"] == "lines" and again["reset"] is True
    await communicator.disconnect()
