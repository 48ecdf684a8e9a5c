"""Fixtures for tests/api: an API client with a token (tests/api/support.py)."""

from tests.api.support import api, token_pair  # noqa: F401
