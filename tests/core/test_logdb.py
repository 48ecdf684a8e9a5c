"""The database log handler behind the live log page: inactive until a server or cluster starts it,
batched, no recursion on its own SQL, survives a missing table, bounded retention; migrate is unharmed."""

from __future__ import annotations

import logging
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from functools import partial

import pytest
from django.db import connection

from core import config as bot_config
from core.logdb import DatabaseLogHandler, log_entries_prune
from core.models import LogEntry
from tests.conftest import ROOT, subprocess_env
from tests.conftest import wait_for as shared_wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def handler():
    h = DatabaseLogHandler()
    logger = logging.getLogger("tests.console.logdb")
    logger.addHandler(h)
    logger.setLevel(logging.DEBUG)
    yield h, logger
    logger.removeHandler(h)
    h.shutdown()


wait_for = partial(shared_wait_for, timeout=10.0)


def test_an_inactive_handler_stores_nothing(handler):
    h, logger = handler
    logger.error("before activation")
    assert h.flush_queue() == 0
    assert not LogEntry.objects.exists()


def test_records_at_info_and_above_are_stored_with_their_origin(handler):
    h, logger = handler
    h.activate("cluster")
    logger.debug("too chatty")
    logger.info("定时消息 scheduled %s", "sm_abc")
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("delivery failed")

    assert wait_for(lambda: LogEntry.objects.count() == 2)
    info, error = LogEntry.objects.order_by("id")
    assert (info.level, info.level_name, info.message) == (20, "INFO", "定时消息 scheduled sm_abc")
    assert info.logger == "tests.console.logdb" and info.module == "test_logdb" and info.line > 0
    assert info.process == "cluster" and abs((datetime.now(UTC) - info.created_at).total_seconds()) < 30
    assert error.level_name == "ERROR" and "ValueError: boom" in error.message and "Traceback" in error.message


def test_the_level_follows_the_config_without_restart(handler):
    h, logger = handler
    h.activate("web")
    with bot_config.override(console={"log_level": "WARNING"}):
        logger.info("dropped")
        logger.warning("kept")
    h.shutdown()  # writes everything queued, then stops: whatever was kept is stored now
    assert list(LogEntry.objects.values_list("message", flat=True)) == ["kept"]


def test_its_own_sql_logging_is_never_stored(handler):
    h, _ = handler
    h.activate("web")
    sql = logging.getLogger("django.db.backends")
    sql.addHandler(h)
    try:
        logging.getLogger("django.db.backends").error("INSERT INTO maibot_logentry ...")
        assert h.flush_queue() == 0
    finally:
        sql.removeHandler(h)


def test_a_missing_table_loses_only_that_batch(handler, capfd, monkeypatch):
    h, logger = handler
    monkeypatch.setattr(h, "_ensure_thread", lambda: None)  # flush by hand: no thread racing the schema change
    h.activate("web")
    with connection.schema_editor() as editor:
        editor.delete_model(LogEntry)
    try:
        logger.error("lost while the table is gone")
        assert h.flush_queue() == 0
        assert "dropped 1 log records" in capfd.readouterr().err
    finally:
        with connection.schema_editor() as editor:
            editor.create_model(LogEntry)
    logger.error("stored again")
    assert h.flush_queue() == 1
    assert list(LogEntry.objects.values_list("message", flat=True)) == ["stored again"]


def test_retention_is_bounded_by_rows_and_age():
    now = datetime.now(UTC)
    LogEntry.objects.bulk_create(
        [
            LogEntry(created_at=now - timedelta(days=10), level=20, level_name="INFO", logger="x", message="ancient"),
            *[
                LogEntry(created_at=now, level=20, level_name="INFO", logger="x", message=f"line {i}")
                for i in range(150)
            ],
        ]
    )
    with bot_config.override(console={"log_retention_rows": 100, "log_retention_days": 7}):
        log_entries_prune(now)
    messages = list(LogEntry.objects.order_by("id").values_list("message", flat=True))
    assert len(messages) == 100
    assert messages[0] == "line 50" and messages[-1] == "line 149"


@pytest.mark.live  # a real manage.py process
def test_migrate_on_an_empty_database_is_unharmed_by_the_handler(tmp_path):
    env = subprocess_env(MAIBOT_DATA_DIR=str(tmp_path))
    env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'fresh.sqlite3'}"
    result = subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v", "1"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "Applying maibot.0001" in result.stdout
    assert "core.logdb" not in result.stderr
