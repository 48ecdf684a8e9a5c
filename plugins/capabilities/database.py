"""database.get / save / query / count / delete: a plugin's own storage, in our table PluginDataRow.

Arguments and results are MaiBot 1.3's (src/plugin_runtime/capabilities/data.py over
src/services/database_service.py): `model_name` names a collection; `filters` are field == value
(AND); `order_by` is a field or a list, "-field" descending; `limit` 0/None = all. A row is its fields
with its `id`. get answers a list (or, with `single_result`, one row or None), save a row, count an
int, delete the number deleted, query whichever its `query_type` (get/create/update/delete/count) does;
unusable arguments answer {"success": false, "error"}, as MaiBot's do.

Unlike MaiBot, where `model_name` is one of the host's own tables, here every collection is the calling
plugin's: whatever the arguments say, a plugin reads and writes only rows stored under its own id, never
another plugin's nor any table of ours (a model name is a collection name, nothing more). Field names
are plain identifiers and filter values JSON scalars, so nothing in the arguments can become a lookup,
a join or SQL. A plugin holds at most MAX_ROWS rows and MAX_BYTES bytes of JSON in all (a row at most
MAX_ROW_BYTES); a write past them is refused with the reason (RuntimeError in the plugin, counted on
its record) and changes nothing. A plugin's writes are serialized (one lock per plugin), so two
concurrent writes cannot both slip under its quota.
"""

from __future__ import annotations

import re
import threading
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.models import Count, F, Func, JSONField, Max, Q, Sum

from plugins.capabilities.common import CapabilityArgError, data_problem, db
from plugins.limits import PluginLimitExceeded

if TYPE_CHECKING:
    from django.db.models import QuerySet

    from plugins.models import PluginDataRow
    from plugins.records import PluginRecord

MAX_ROWS = 10_000  # rows one plugin may hold, all collections together
MAX_BYTES = 16 * 1024 * 1024  # JSON bytes one plugin may hold
MAX_ROW_BYTES = 256 * 1024  # JSON bytes of one row
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
SCALARS = (str, int, float, bool, type(None))

_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock(plugin_id: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(plugin_id, threading.Lock())


def _name(value: Any, what: str) -> str:
    # "__" would be a Django lookup ("data__x__regex", "plugin_id__in"): never let one through.
    if not isinstance(value, str) or not NAME.match(value) or "__" in value:
        raise CapabilityArgError(f"{what} {value!r} is not a plain name (letters, digits, _; no __; ≤ 64)")
    return value


def _filters(raw: Any) -> Q:
    if raw in (None, {}):
        return Q()
    if not isinstance(raw, dict):
        raise CapabilityArgError("filters must be an object of field: value")
    query = Q()
    for key, value in raw.items():
        field = _name(key, "filter field")
        if not isinstance(value, SCALARS) or (isinstance(value, float) and value != value):
            raise CapabilityArgError(f"filter {field} must be a JSON scalar (field == value only), not {value!r}")
        if field == "id":
            query &= Q(row_id=value) if isinstance(value, int) and not isinstance(value, bool) else Q(pk__in=[])
        elif value is None:  # as a NULL column: the field is null or missing
            query &= Q(**{f"data__{field}": None}) | Q(**{f"data__{field}__isnull": True})
        else:
            query &= Q(**{f"data__{field}": value})
    return query


class _SortKey(Func):
    """A field's value to ORDER BY: numbers as numbers, JSON null and a missing field both SQL NULL (on
    SQLite, Django's key transform sorts null as the text 'null', after every number)."""

    output_field = JSONField()

    def __init__(self, field: str) -> None:
        super().__init__(F("data"))
        self.key = field  # a plain name (NAME): it still travels as a parameter

    def as_sql(self, compiler, connection, **extra):
        sql, params = compiler.compile(self.source_expressions[0])
        return f"JSON_EXTRACT({sql}, %s)", [*params, f"$.{self.key}"]

    def as_postgresql(self, compiler, connection, **extra):
        sql, params = compiler.compile(self.source_expressions[0])
        return f"NULLIF(({sql} -> %s), 'null'::jsonb)", [*params, self.key]


def _ordering(raw: Any) -> list[Any]:
    # NULL (or a missing field) sorts as the smallest value on every database, as on MaiBot's SQLite.
    if raw in (None, "", []):
        return ["row_id"]
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or len(items) > 8:
        raise CapabilityArgError("order_by must be a field name or a list of at most 8")
    ordering = []
    for item in items:
        descending = isinstance(item, str) and item.startswith("-")
        field = _name(item[1:] if descending else item, "order_by field")
        column = F("row_id") if field == "id" else _SortKey(field)
        ordering.append(column.desc(nulls_last=True) if descending else column.asc(nulls_first=True))
    return [*ordering, "row_id"]


def _limit(raw: Any) -> int:
    if raw in (None, ""):
        return 0
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise CapabilityArgError(f"limit must be a whole number ≥ 0, not {raw!r}")
    return raw


def _fields(raw: Any, what: str) -> dict[str, Any]:
    if not isinstance(raw, dict) or not raw:
        raise CapabilityArgError(f"{what} must be a non-empty object of field: value")
    for key in raw:
        _name(key, "field")
    if problem := data_problem(raw, MAX_ROW_BYTES):
        raise CapabilityArgError(f"{what} {problem}")
    return raw


def _size(data: dict[str, Any]) -> int:
    import json

    return len(json.dumps(data, ensure_ascii=False, allow_nan=False).encode("utf-8"))


def _row(row: PluginDataRow) -> dict[str, Any]:
    return {**row.data, "id": row.row_id}


class _Store:
    """One plugin's view of one collection; every query starts from its own rows."""

    def __init__(self, record: PluginRecord, model_name: Any) -> None:
        from plugins.models import PluginDataRow

        self.record = record
        self.model_name = _name(model_name, "model_name")
        self.mine = PluginDataRow.objects.filter(plugin_id=record.plugin_id)
        self.rows: QuerySet[PluginDataRow] = self.mine.filter(model_name=self.model_name)

    def select(self, filters: Any, order_by: Any = None, limit: Any = None) -> QuerySet[PluginDataRow]:
        rows = self.rows.filter(_filters(filters)).order_by(*_ordering(order_by))
        return rows[: _limit(limit)] if _limit(limit) else rows

    def _charge(self, added_rows: int, added_bytes: int) -> None:
        usage = self.mine.aggregate(rows=Count("pk"), size=Sum("size"))
        rows, size = usage["rows"] + added_rows, (usage["size"] or 0) + added_bytes
        reason = ""
        if added_rows > 0 and rows > MAX_ROWS:
            reason = f"database quota: {rows} rows would exceed {MAX_ROWS} per plugin"
        elif added_bytes > 0 and size > MAX_BYTES:
            reason = f"database quota: {size} bytes would exceed {MAX_BYTES} per plugin"
        if reason:
            self.record.refused("database", reason)
            raise PluginLimitExceeded(reason)

    def create(self, data: dict[str, Any]) -> dict[str, Any]:
        data = dict(_fields(data, "data"))
        wanted = data.pop("id", None)
        with _lock(self.record.plugin_id), transaction.atomic():
            if wanted is not None:
                if isinstance(wanted, bool) or not isinstance(wanted, int) or wanted <= 0:
                    raise CapabilityArgError(f"id must be a positive whole number, not {wanted!r}")
                if self.rows.filter(row_id=wanted).exists():
                    raise CapabilityArgError(f"{self.model_name} already has a row with id {wanted}")
            size = _size(data)
            self._charge(1, size)
            row_id = wanted or (self.rows.aggregate(top=Max("row_id"))["top"] or 0) + 1
            row = self.rows.create(
                plugin_id=self.record.plugin_id, model_name=self.model_name, row_id=row_id, data=data, size=size
            )
        return _row(row)

    def update(self, data: Any, filters: Any, first_only: bool = False) -> list[dict[str, Any]]:
        data = _fields(data, "data")
        if "id" in data:
            raise CapabilityArgError("a row's id cannot be changed")
        with _lock(self.record.plugin_id), transaction.atomic():
            rows = list(self.select(filters)[:1] if first_only else self.select(filters))
            grown = 0
            for row in rows:
                row.data = {**row.data, **data}
                new_size = _size(row.data)
                if new_size > MAX_ROW_BYTES:
                    raise CapabilityArgError(f"row {row.row_id} would be larger than {MAX_ROW_BYTES} bytes as JSON")
                grown, row.size = grown + new_size - row.size, new_size
            self._charge(0, grown)
            for row in rows:
                row.save(update_fields=["data", "size", "updated_at"])
        return [_row(row) for row in rows]


def _error(exc: Exception) -> dict[str, Any]:
    return {"success": False, "error": str(exc)}


async def _run(work) -> Any:
    try:
        return await db(work)
    except CapabilityArgError as exc:
        return _error(exc)


def _get(record: PluginRecord, args: dict[str, Any]) -> Any:
    store = _Store(record, args.get("model_name"))
    rows = [_row(r) for r in store.select(args.get("filters"), args.get("order_by"), args.get("limit"))]
    if args.get("single_result"):
        return rows[0] if rows else None
    return rows


def _save(record: PluginRecord, args: dict[str, Any]) -> Any:
    store = _Store(record, args.get("model_name"))
    key_field, key_value = args.get("key_field"), args.get("key_value")
    if key_field and key_value is not None:
        found = store.update(args.get("data"), {_name(key_field, "key_field"): key_value}, first_only=True)
        if found:
            return found[0]
    return store.create(args.get("data"))


def _count(record: PluginRecord, args: dict[str, Any]) -> int:
    return _Store(record, args.get("model_name")).select(args.get("filters")).count()


def _delete(record: PluginRecord, args: dict[str, Any]) -> int:
    store = _Store(record, args.get("model_name"))
    with _lock(record.plugin_id), transaction.atomic():
        ids = list(store.select(args.get("filters")).values_list("pk", flat=True))
        return store.rows.filter(pk__in=ids).delete()[0]


def _query(record: PluginRecord, args: dict[str, Any]) -> Any:
    kind = args.get("query_type", "get")
    if kind == "get":
        return _get(record, args)
    if kind in ("create", "update") and not args.get("data"):
        return {"success": False, "error": f"{kind} 需要 data"}
    if kind == "create":
        return _Store(record, args.get("model_name")).create(args.get("data"))
    if kind == "update":
        return len(_Store(record, args.get("model_name")).update(args.get("data"), args.get("filters")))
    if kind == "delete":
        return _delete(record, args)
    if kind == "count":
        return _count(record, args)
    return {"success": False, "error": f"不支持的 query_type: {kind}"}


def _needs_model(args: dict[str, Any]) -> dict[str, Any] | None:
    if not args.get("model_name"):
        return {"success": False, "error": "缺少必要参数 model_name"}
    return None


async def get(record: PluginRecord, args: dict[str, Any]) -> Any:
    return _needs_model(args) or await _run(lambda: _get(record, args))


async def save(record: PluginRecord, args: dict[str, Any]) -> Any:
    if not args.get("model_name") or not args.get("data"):
        return {"success": False, "error": "缺少必要参数 model_name 或 data"}
    return await _run(lambda: _save(record, args))


async def query(record: PluginRecord, args: dict[str, Any]) -> Any:
    return _needs_model(args) or await _run(lambda: _query(record, args))


async def count(record: PluginRecord, args: dict[str, Any]) -> Any:
    return _needs_model(args) or await _run(lambda: _count(record, args))


async def delete(record: PluginRecord, args: dict[str, Any]) -> Any:
    if refusal := _needs_model(args):
        return refusal
    if not args.get("filters"):
        return {"success": False, "error": "缺少必要参数 filters（不允许无条件删除）"}
    return await _run(lambda: _delete(record, args))
