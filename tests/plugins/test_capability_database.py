"""database.* through the real maibot-plugin-sdk's PluginContext: the shapes MaiBot 1.3's host answers
(a list of rows with their id, one row or None, a count, the number deleted), every collection the
calling plugin's own; a hostile plugin in its own runner finds neither another plugin's rows nor our
tables, whatever it smuggles through the arguments; writes past a plugin's quota are refused and change
nothing."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from plugins.capabilities import database
from plugins.host import PluginHost, PluginState
from plugins.models import PluginDataRow
from tests.plugins.sdk_context import plugin as sdk_plugin
from tests.plugins.sdk_context import run

pytestmark = pytest.mark.django_db(transaction=True)

DB_CAPS = ["database.get", "database.save", "database.query", "database.count", "database.delete"]
SNOOP = "test.core.db-snoop"
VICTIM = "test.core.db-victim"
FIXTURE = Path(__file__).resolve().parent / "hostile_fixtures" / "db_snoop"


def plugin(plugin_id: str, capabilities: list[str] = DB_CAPS):
    return sdk_plugin(plugin_id, capabilities)


def test_rows_come_back_in_maibots_shapes(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    _, ctx = plugin("test.core.db-notes")
    first = run(ctx.db.save("notes", {"title": "早安", "score": 3, "done": False, "tags": ["a"]}))
    assert first == {"title": "早安", "score": 3, "done": False, "tags": ["a"], "id": 1}
    run(ctx.db.save("notes", {"title": "晚安", "score": 5, "done": True}))
    run(ctx.db.save("notes", {"title": "无分", "score": None, "done": False}))
    # save with a key updates the row it finds (fields merged), else inserts
    assert run(ctx.db.save("notes", {"score": 4}, key_field="title", key_value="早安"))["score"] == 4
    assert run(ctx.db.save("notes", {"title": "新", "done": False}, key_field="title", key_value="x"))["id"] == 4

    rows = run(ctx.db.get("notes", order_by="-score"))  # null and missing last, as on MaiBot's SQLite
    assert [r["title"] for r in rows] == ["晚安", "早安", "无分", "新"]
    assert run(ctx.db.get("notes", filters={"done": True})) == [{"title": "晚安", "score": 5, "done": True, "id": 2}]
    assert [r["id"] for r in run(ctx.db.get("notes", filters={"score": None}))] == [3, 4]  # null or missing
    assert run(ctx.db.get("notes", filters={"id": 2}, single_result=True))["title"] == "晚安"
    assert run(ctx.db.get("notes", filters={"title": "nobody"}, single_result=True)) is None
    assert [r["id"] for r in run(ctx.db.get("notes", order_by=["done", "-id"], limit=2))] == [4, 3]
    assert run(ctx.db.get("never_written")) == []

    assert run(ctx.db.count("notes")) == 4 and run(ctx.db.count("notes", {"done": False})) == 3
    assert run(ctx.db.query("notes", "update", data={"done": True}, filters={"done": False})) == 3
    assert run(ctx.db.query("notes", "count", filters={"done": True})) == 4
    assert run(ctx.db.query("notes", "create", data={"title": "q"}))["id"] == 5
    assert run(ctx.db.query("notes", "get", filters={"title": "q"}, single_result=True))["id"] == 5
    assert run(ctx.db.delete("notes", {"title": "q"})) == 1
    assert run(ctx.db.query("notes", "delete")) == 4  # query's delete needs no filters, as in MaiBot
    assert run(ctx.db.count("notes")) == 0


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda ctx: ctx.db.get(""), "缺少必要参数 model_name"),
        (lambda ctx: ctx.db.delete("notes", {}), "不允许无条件删除"),
        (lambda ctx: ctx.db.query("notes", "drop"), "不支持的 query_type: drop"),
        (lambda ctx: ctx.db.query("notes", "create"), "create 需要 data"),
        (lambda ctx: ctx.db.get("notes", filters={"a__gt": 1}), "is not a plain name"),
        (lambda ctx: ctx.db.get("notes", filters={"a": [1, 2]}), "must be a JSON scalar"),
        (lambda ctx: ctx.db.get("notes", limit=-1), "limit must be a whole number"),
        (lambda ctx: ctx.db.get("notes", order_by="-data__a"), "is not a plain name"),
        (lambda ctx: ctx.db.save("notes", {"bad key": 1}), "is not a plain name"),
        (lambda ctx: ctx.db.save("notes", {"x": "\x00"}), "NUL"),
        (lambda ctx: ctx.db.save("notes", {"x": float("nan")}), "is not JSON"),
        (lambda ctx: ctx.db.save("notes", {"x": "长" * 100_000}), "is larger than 262144 bytes"),
        (lambda ctx: ctx.db.query("notes", "update", data={"id": 9}), "id cannot be changed"),
    ],
)
def test_unusable_arguments_are_error_results_and_store_nothing(settings, tmp_path, call, error):
    settings.DATA_DIR = tmp_path
    _, ctx = plugin("test.core.db-notes")
    result = run(call(ctx))
    assert result["success"] is False and error in result["error"]
    assert not PluginDataRow.objects.exists()


def test_writes_past_the_quota_are_refused_with_the_reason_and_change_nothing(settings, tmp_path, monkeypatch):
    settings.DATA_DIR = tmp_path
    record, ctx = plugin("test.core.db-hoarder")
    monkeypatch.setattr(database, "MAX_ROWS", 3)
    monkeypatch.setattr(database, "MAX_BYTES", 2_000)
    for i in range(3):
        run(ctx.db.save("a" if i else "b", {"n": i}))
    with pytest.raises(RuntimeError, match="refused: database quota: 4 rows would exceed 3 per plugin"):
        run(ctx.db.save("c", {"n": 9}))
    assert record.refusals == {"database": 1} and "4 rows would exceed 3" in record.last_refusal
    # bytes: growing the rows in place past the quota changes none of them
    with pytest.raises(RuntimeError, match="bytes would exceed 2000 per plugin"):
        run(ctx.db.query("a", "update", data={"blob": "x" * 1_000}))
    assert sorted(PluginDataRow.objects.values_list("data", flat=True), key=str) == [{"n": 0}, {"n": 1}, {"n": 2}]
    # another plugin's quota is its own
    _, other = plugin("test.core.db-other")
    assert run(other.db.save("a", {"n": 1}))["id"] == 1


def test_a_plugin_without_the_capability_declared_is_refused(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    _, ctx = plugin("test.core.db-reader", ["database.get"])
    with pytest.raises(
        RuntimeError, match=re.escape("database.save is not declared in plugin test.core.db-reader's manifest")
    ):
        run(ctx.db.save("notes", {"a": 1}))
    assert not PluginDataRow.objects.exists()


def test_a_hostile_plugin_in_its_runner_finds_no_row_but_its_own(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    _, victim = plugin(VICTIM)
    run(victim.db.save("notes", {"title": "diary", "secret": "s3cr3t"}))
    run(victim.db.save("Message", {"secret": "s3cr3t"}))
    directory = tmp_path / "plugins"
    shutil.copytree(FIXTURE, directory / "db_snoop", ignore=shutil.ignore_patterns("__pycache__"))
    host = PluginHost()
    try:
        host.load_all(directory)
        record = host.records[SNOOP]
        assert record.state == PluginState.LOADED, record.reason
        found = host.run(record.context.api.call(f"{SNOOP}.snoop"), 60)
    finally:
        host.stop()

    assert "s3cr3t" not in str(found)
    empty = ("plain", "filter_plugin_id", "sql_in_value", "our_rows_table", "our_messages", "their_table_name")
    for name in (*empty, "extra_plugin_id_arg"):
        assert found[name] == [], name
    for name in ("lookup_in_filter", "join_in_filter", "sql_in_model", "order_by_lookup"):
        assert found[name]["success"] is False and "is not a plain name" in found[name]["error"], name
    assert found["mongo_operator"]["success"] is False and "must be a JSON scalar" in found["mongo_operator"]["error"]
    assert found["count"] == found["update_all"] == found["delete_by_id"] == found["delete_all"] == 0
    assert found["undeclared_save"].startswith("raised RuntimeError: capability database.save is not declared")
    assert list(PluginDataRow.objects.order_by("pk").values_list("plugin_id", "data")) == [
        (VICTIM, {"title": "diary", "secret": "s3cr3t"}),
        (VICTIM, {"secret": "s3cr3t"}),
    ]
