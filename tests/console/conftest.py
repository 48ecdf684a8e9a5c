"""Fixtures of the console's tests, and the Chromium ones' shared set-up."""

import threading
from collections.abc import Callable, Iterator

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from tests.conftest import CHROMIUM_ARGS, require_chromium


@pytest.fixture
def operator(admin_client) -> Client:
    """The console as an operator sees it: a superuser's logged-in client."""
    return admin_client


@pytest.fixture
def browser_operator(transactional_db) -> User:
    """The superuser "op" (password pw-123456) a browser test logs in as. Made before the browser starts:
    sync playwright runs an event loop in this thread."""
    return User.objects.create_superuser("op", password="pw-123456")


@pytest.fixture
def browser() -> Iterator[object]:
    """Headless Chromium (Debian's), closed after the test."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=require_chromium(), args=CHROMIUM_ARGS, headless=True)
        yield chromium
        chromium.close()


def in_thread(fn: Callable[[], object]) -> None:
    """A database write from outside playwright's event loop thread."""

    def run() -> None:
        try:
            fn()
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
