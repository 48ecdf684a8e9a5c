"""The config editor's structured fields: a list of tables ([[llm.models]], [[llm.budgets]],
[[chat.talk_frequency_rules]], [[mcp.servers]], [[plugins.limits]]) edited as a table of rows, and the
task routes ([llm.tasks]) as one line per task.

Owns the conversion between what the browser posts and plain data; never the validation: a row's cells stay
strings (a list cell one item per line, a map cell one `name = value` per line) and the config's own
pydantic model converts and checks them in ConfigForm.clean, which names the row and the column of a bad
cell. A blank cell is left out, so the field's default applies (None where the field may be empty). A
row with every cell blank, or its "remove" ticked, is no row. A post without the table (a client that
does not know it) changes nothing: the field counts as unchanged.
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any

import tomlkit
from django import forms
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext, gettext_noop
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

EXTRA_ROWS = 2  # blank rows offered for new entries
# The choices of the config's Literal fields, shown in the operator's language (the value stays as written).
CHOICE_NAMES = (gettext_noop("model"), gettext_noop("task"), gettext_noop("session"))


def column_kind(annotation: Any) -> str:
    """What a table's column holds: str, int, float, bool, choice, list or map (`X | None`: as X)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        (annotation,) = [a for a in typing.get_args(annotation) if a is not type(None)]
        return column_kind(annotation)
    if origin is typing.Annotated:
        return column_kind(typing.get_args(annotation)[0])
    if origin is typing.Literal:
        return "choice"
    if origin is list:
        return "list"
    if origin is dict:
        return "map"
    return {str: "str", int: "int", float: "float", bool: "bool"}[annotation]


def cell_text(value: Any, kind: str) -> str:
    """A cell's (or a list or map field's) text: a value of the config, or the text posted (kept as posted)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if kind == "list":
        return "\n".join(str(v) for v in value)
    if kind == "map":
        return "\n".join(f"{k} = {v}" for k, v in value.items())
    if kind == "bool":
        return "true" if value else "false"
    return str(value)


def parse_map(text: str) -> dict[str, str]:
    """One `name = value` per line (blank lines skipped)."""
    result = {}
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            key, sep, item = line.partition("=")
            if not sep or not key.strip():
                raise forms.ValidationError(
                    gettext("line %(number)d: write `name = value`") % {"number": number}, code="invalid"
                )
            result[key.strip()] = item.strip()
    return result


def parse_cell(text: str, kind: str) -> Any:
    """A cell's (or a list or map field's) text as data: a list one item per line, a map one
    `name = value` per line, anything else the text (the config's model converts it)."""
    if kind == "list":
        return [line.strip() for line in text.splitlines() if line.strip()]
    if kind == "map":
        return parse_map(text)
    return text


class Column:
    def __init__(self, key: str, info: FieldInfo) -> None:
        self.key = key
        self.kind = column_kind(info.annotation)
        self.title = gettext(info.title) if info.title else key
        self.help = gettext(info.description) if info.description else ""
        self.choices = typing.get_args(info.annotation) if self.kind == "choice" else ()


class JsonHidden(forms.HiddenInput):
    """The table as the operator was shown it (show_hidden_initial), as JSON."""

    def format_value(self, value: Any) -> str:
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


class TableWidget(forms.Widget):
    def __init__(self, columns: list[Column]) -> None:
        super().__init__()
        self.columns = columns

    def value_from_datadict(self, data, files, name) -> list[dict[str, str]] | None:
        try:
            count = int(data.get(f"{name}-rows", ""))
        except ValueError:
            return None  # not posted: unchanged
        rows = []
        for i in range(min(count, 1000)):
            if data.get(f"{name}-{i}-remove"):
                continue
            texts = {c.key: data.get(f"{name}-{i}-{c.key}", "") for c in self.columns if c.kind != "bool"}
            if any(text.strip() for text in texts.values()):  # a row of blank cells (ticks aside) is none
                ticks = {c.key: "true" if data.get(f"{name}-{i}-{c.key}") else "false" for c in self.columns}
                rows.append({key: texts.get(key, tick) for key, tick in ticks.items()})
        return rows

    def render(self, name, value, attrs=None, renderer=None) -> SafeString:
        rows = list(value or []) + [{} for _ in range(EXTRA_ROWS)]
        head = format_html_join(
            "",
            '<th scope="col" title="{}">{}<br><code class="config-key">{}</code></th>',
            ((c.help, c.title, c.key) for c in self.columns),
        )
        body = mark_safe("".join(self._row(name, i, row) for i, row in enumerate(rows)))
        return format_html(
            '<div class="config-table-wrap"><table class="config-table" id="id_{}"><thead><tr>{}<th scope="col">{}</th>'
            '</tr></thead><tbody>{}</tbody></table></div><input type="hidden" name="{}-rows" value="{}">',
            name, head, gettext("Remove"), body, name, len(rows),
        )  # fmt: skip

    def _row(self, name: str, i: int, row: dict[str, str]) -> str:
        cells = "".join(str(self._cell(f"{name}-{i}-{c.key}", c, row.get(c.key, ""))) for c in self.columns)
        remove = format_html(
            '<td><input type="checkbox" name="{}-{}-remove" aria-label="{}"></td>', name, i, gettext("Remove")
        )
        return f"<tr>{cells}{remove}</tr>"

    @staticmethod
    def _cell(field: str, column: Column, text: str) -> SafeString:
        if column.kind == "bool":
            checked = mark_safe(" checked") if text != "false" else ""
            return format_html(
                '<td><input type="checkbox" name="{}" aria-label="{}"{}></td>', field, column.title, checked
            )
        if column.kind == "choice":
            options = format_html_join(
                "",
                '<option value="{}"{}>{}</option>',
                (
                    (c, mark_safe(" selected") if c == text else "", gettext(c) if c else "—")
                    for c in ("", *column.choices)
                ),
            )
            return format_html('<td><select name="{}" aria-label="{}">{}</select></td>', field, column.title, options)
        if column.kind in ("list", "map"):
            return format_html(
                '<td><textarea name="{}" rows="2" cols="24" aria-label="{}">{}</textarea></td>',
                field,
                column.title,
                text,
            )
        cell = '<td><input type="text" name="{}" value="{}" aria-label="{}"></td>'
        return format_html(cell, field, text, column.title)


class TableField(forms.Field):
    """A list of one pydantic model's rows (see the module's docstring)."""

    hidden_widget = JsonHidden

    def __init__(self, item_model: type, **kwargs: Any) -> None:
        self.columns = [Column(key, info) for key, info in item_model.model_fields.items()]
        super().__init__(required=False, widget=TableWidget(self.columns), **kwargs)

    def prepare_value(self, value: Any) -> Any:
        """Rows of cell texts, from the config's values or from what was posted."""
        if not isinstance(value, list):
            return value
        return [
            {c.key: cell_text(row.get(c.key), c.kind) for c in self.columns} for row in value if isinstance(row, dict)
        ]

    def to_python(self, value: Any) -> list[dict[str, Any]] | None:
        """The rows as plain data, blank cells left out; idempotent (already parsed cells stay)."""
        if value is None:
            return None
        if isinstance(value, str):
            value = json.loads(value or "[]")
        kinds = {c.key: c.kind for c in self.columns}
        return [
            {key: parse_cell(cell, kinds[key]) if isinstance(cell, str) else cell for key, cell in row.items()
             if key in kinds and not (isinstance(cell, str) and not cell.strip())}
            for row in value
        ]  # fmt: skip

    def has_changed(self, initial: Any, data: Any) -> bool:
        if data is None:  # not posted
            return False
        return self.to_python(initial) != self.to_python(data)


class RoutesField(forms.CharField):
    """[llm.tasks]: one `task = model, model` per line (the first that answers wins)."""

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, dict):
            return "\n".join(f"{task} = {', '.join(names)}" for task, names in value.items())
        return value

    def to_python(self, value: Any) -> dict[str, list[str]]:
        routes = {}
        for task, text in parse_map(super().to_python(value) or "").items():
            routes[task] = [name.strip() for name in text.split(",") if name.strip()]
        return routes


def table_item(annotation: Any) -> type[BaseModel] | None:
    """The model of a list-of-tables field (list[Model]), else None."""
    if typing.get_origin(annotation) is list:
        (item,) = typing.get_args(annotation)
        if isinstance(item, type) and issubclass(item, BaseModel):
            return item
    return None


def is_routes(annotation: Any) -> bool:
    """dict[name, list[name]] ([llm.tasks])."""
    return typing.get_origin(annotation) is dict and typing.get_origin(typing.get_args(annotation)[1]) is list


def same_value(info: FieldInfo, written: Any, value: Any) -> bool:
    """Whether the file's `written` value (as tomlkit reads it) means the config's `value`: as written,
    but a list of tables through its model (the file gives only the keys that differ from defaults)."""
    if table_item(info.annotation) is None:
        return written == value
    try:
        return TypeAdapter(info.annotation).validate_python(written) == value
    except ValidationError:
        return False


def toml_value(value: Any) -> Any:
    """What to write for a config value: a list of tables as an array of tables ([[section.key]]), each
    with the keys that differ from their defaults; anything else as it is."""
    if isinstance(value, list) and value and all(isinstance(item, BaseModel) for item in value):
        tables = tomlkit.aot()
        for item in value:
            table = tomlkit.table()
            table.update(item.model_dump(exclude_defaults=True))
            tables.append(table)
        return tables
    return value
