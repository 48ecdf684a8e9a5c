"""Hot reload of bot_config.toml with the real watchfiles watcher on a temporary file: valid changes are
applied, invalid ones rejected with the old config kept, callbacks run in priority order and isolated,
and a burst of writes is one reload."""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import pytest

from core import reload
from core.config import get_config, render_template
from tests.conftest import wait_for as shared_wait_for

pytestmark = pytest.mark.backend_independent


@pytest.fixture
def clean_reload_state():
    saved = list(reload._registrations)
    reload._registrations.clear()
    reload._applied_digest = None
    reload.last_error = reload.last_result = None
    yield
    reload._registrations[:] = saved
    reload._applied_digest = None
    reload.last_error = reload.last_result = None


@pytest.fixture
def config_file(tmp_path, clean_reload_state) -> Path:
    path = tmp_path / "bot_config.toml"
    path.write_text(render_template(), encoding="utf-8")
    return path


@pytest.fixture
def watcher(config_file):
    w = reload.ConfigWatcher(config_file, debounce_ms=200).start()
    yield w
    w.stop()


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


wait_for = partial(shared_wait_for, timeout=15.0)


def test_a_valid_edit_of_the_file_is_applied_without_restart(config_file, watcher):
    seen = []
    reload.register_reload_callback(lambda new, old: seen.append((old.bot.nickname, new.bot.nickname)))

    edit(config_file, 'nickname = "麦麦"', 'nickname = "小麦 Mai"')

    assert wait_for(lambda: get_config().bot.nickname == "小麦 Mai")
    # The reload is over once its result is recorded (after the swap and the callbacks).
    assert wait_for(lambda: reload.last_result is not None and reload.last_result.changed_keys == ["bot.nickname"])
    assert seen == [("麦麦", "小麦 Mai")]
    assert reload.last_error is None
    assert reload.last_result.changed_keys == ["bot.nickname"]


def test_an_invalid_edit_is_rejected_and_the_old_config_stays(config_file, watcher):
    calls = []
    reload.register_reload_callback(lambda new, old: calls.append(new))
    edit(config_file, "max_rounds = 5", "max_rounds = 0")

    assert wait_for(lambda: reload.last_error is not None)
    assert "chat.max_rounds" in reload.last_error.error
    assert "greater than or equal to 1" in reload.last_error.error
    assert get_config().chat.max_rounds == 5
    assert calls == []

    # Broken TOML is rejected the same way, naming the problem.
    config_file.write_text("[chat\nmax_rounds = 3\n", encoding="utf-8")
    assert wait_for(lambda: "not valid TOML" in reload.last_error.error)
    assert get_config().chat.max_rounds == 5

    # Fixing the file applies it and clears the error.
    config_file.write_text(render_template().replace("max_rounds = 5", "max_rounds = 7"), encoding="utf-8")
    assert wait_for(lambda: get_config().chat.max_rounds == 7)
    assert wait_for(lambda: reload.last_result.ok and reload.last_result.changed_keys == ["chat.max_rounds"])
    assert reload.last_error is None
    assert len(calls) == 1


def test_callbacks_run_in_priority_order_and_one_failure_does_not_stop_the_others(config_file, watcher):
    order = []

    def late(new, old):
        order.append("late-100")

    def broken(new, old):
        order.append("broken-50")
        raise RuntimeError("callback exploded")

    def first(new, old):
        order.append("first-10")

    async def async_a(new, old):
        order.append("async-a-70")

    async def async_b(new, old):
        raise ValueError("async callback exploded")

    reload.register_reload_callback(late, priority=100)
    reload.register_reload_callback(broken, priority=50)
    reload.register_reload_callback(async_a, priority=70)
    reload.register_reload_callback(async_b, priority=70)
    reload.register_reload_callback(first, priority=10)

    edit(config_file, "temperature = 0.7", "temperature = 0.2")

    assert wait_for(lambda: "late-100" in order)
    assert order == ["first-10", "broken-50", "async-a-70", "late-100"]
    assert get_config().llm.temperature == 0.2
    errors = reload.last_result.callback_errors
    assert len(errors) == 2
    assert any("callback exploded" in e and "broken" in e for e in errors)
    assert any("async callback exploded" in e for e in errors)


@pytest.fixture
def slow_watcher(config_file):
    """A watcher whose quiet period (1 s) no stall of a loaded machine between two writes of a burst
    20 ms apart reaches: with 200 ms, a descheduled test thread split the burst into two reloads."""
    w = reload.ConfigWatcher(config_file, debounce_ms=1000).start()
    yield w
    w.stop()


def test_a_burst_of_writes_is_one_reload(config_file, slow_watcher):
    watcher = slow_watcher
    calls = []
    reload.register_reload_callback(lambda new, old: calls.append(new.bot.nickname))
    base = config_file.read_text(encoding="utf-8")
    for i in range(6):
        config_file.write_text(base.replace('nickname = "麦麦"', f'nickname = "burst {i}"'), encoding="utf-8")
        time.sleep(0.02)  # kept: the burst's own pacing (writes 20 ms apart), not a wait for a condition

    assert wait_for(lambda: get_config().bot.nickname == "burst 5")
    # One more edit after the burst: the watcher handles changes in order, so once this one is applied
    # every event of the burst has been handled, and no second reload of the burst can still come.
    edit(config_file, 'nickname = "burst 5"', 'nickname = "after the burst"')
    assert wait_for(lambda: get_config().bot.nickname == "after the burst" and watcher.reloads >= 2)
    assert calls == ["burst 5", "after the burst"]
    assert watcher.reloads == 2


def test_rewriting_the_same_config_runs_no_callbacks(config_file, watcher):
    calls = []
    reload.register_reload_callback(lambda new, old: calls.append(new))
    # A comment-only change: a reload happens, but the config is equal, so nothing is re-run.
    config_file.write_text(config_file.read_text(encoding="utf-8") + "\n# a note\n", encoding="utf-8")
    assert wait_for(lambda: reload.last_result is not None)
    assert reload.last_result.ok and reload.last_result.changed_keys == []
    assert calls == []


def test_saving_from_the_console_applies_once_even_though_the_watcher_sees_the_write(
    config_file, watcher, monkeypatch, db
):
    calls = []
    reload.register_reload_callback(lambda new, old: calls.append(new.chat.history_window))
    text = config_file.read_text(encoding="utf-8").replace("history_window = 30", "history_window = 12")
    reads = []  # what the watcher's re-reads of the file returned
    real_reload_from_file = reload.reload_from_file

    def spy(path=None):
        reads.append(real_reload_from_file(path))
        return reads[-1]

    monkeypatch.setattr(reload, "reload_from_file", spy)

    result = reload.config_save_text(text=text, path=config_file)

    assert result.changed_keys == ["chat.history_window"]
    assert get_config().chat.history_window == 12
    assert wait_for(lambda: reads)  # the watcher saw the replace and read the file: nothing new
    assert all(r is None for r in reads), reads
    assert calls == [12]
    assert watcher.reloads == 0
    assert config_file.read_text(encoding="utf-8") == text
    assert not list(config_file.parent.glob(".*.tmp"))


def test_an_invalid_save_writes_nothing(config_file, clean_reload_state):
    before = config_file.read_text(encoding="utf-8")
    with pytest.raises(reload.ConfigError, match=r"chat\.max_rounds"):
        reload.config_save_text(text=before.replace("max_rounds = 5", "max_rounds = 99"), path=config_file)
    assert config_file.read_text(encoding="utf-8") == before
    assert get_config().chat.max_rounds == 5
