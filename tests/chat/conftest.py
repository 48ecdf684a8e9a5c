"""Fixtures for tests/chat (each area keeps its fixtures in its own support module)."""

from tests.chat.api_support import api, token_pair  # noqa: F401
