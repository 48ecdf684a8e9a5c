"""Fixtures of the console's tests."""

import pytest
from django.test import Client


@pytest.fixture
def operator(admin_client) -> Client:
    """The console as an operator sees it: a superuser's logged-in client."""
    return admin_client
