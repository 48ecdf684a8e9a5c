"""Shared helpers for the proactive API tests: a token, an authenticated client, tiny images."""

from __future__ import annotations

import base64
import json
import struct
import zlib
from typing import Any

import pytest
from django.test import Client

from api.access import api_token_create


def png_bytes(width: int = 2, height: int = 2) -> bytes:
    """A real (tiny) PNG, made here: no fixture files."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def png_base64() -> str:
    return base64.b64encode(png_bytes()).decode()


class ApiClient:
    """The Django test client speaking JSON with a bearer token."""

    def __init__(self, raw_token: str | None) -> None:
        self.client = Client()
        self.raw_token = raw_token

    def _headers(self, headers: dict[str, str] | None) -> dict[str, str]:
        out = {"Authorization": f"Bearer {self.raw_token}"} if self.raw_token else {}
        return {**out, **(headers or {})}

    def post(self, path: str, body: Any = None, *, headers: dict[str, str] | None = None, raw: bytes | None = None):
        data = raw if raw is not None else json.dumps(body if body is not None else {})
        return self.client.post(
            f"/api/v1{path}", data=data, content_type="application/json", headers=self._headers(headers)
        )

    def get(self, path: str, params: dict[str, Any] | None = None, *, headers: dict[str, str] | None = None):
        return self.client.get(f"/api/v1{path}", params or {}, headers=self._headers(headers))


@pytest.fixture
def token_pair(db):
    """(ApiToken, raw token string)."""
    return api_token_create(name="test-system")


@pytest.fixture
def api(token_pair) -> ApiClient:
    return ApiClient(token_pair[1])
