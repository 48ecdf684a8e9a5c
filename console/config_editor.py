"""The console's config editor: a Django form generated from the pydantic config model, and the edit of
the TOML file that keeps its comments and layout (values are changed in the parsed tomlkit document,
never re-rendered). Both show the config with its secrets redacted (core.redaction) and give a
placeholder saved where it was its secret back."""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from typing import Any

import tomlkit
from django import forms
from django.utils import translation
from django.utils.translation import gettext
from pydantic import ValidationError
from pydantic.fields import FieldInfo

from console.config_tables import (
    RoutesField,
    TableField,
    cell_text,
    is_routes,
    parse_cell,
    same_value,
    table_item,
    toml_value,
)
from core.config import (
    RETIRED_KEYS,
    BotConfig,
    ConfigError,
    config_path,
    ensure_config_file,
    get_config,
    parse_config,
    requires_restart,
    retired_keys,
)
from core.redaction import Secrets, redact_data, restore_data

SEP = "__"  # form field name: <section>__<key>
# The languages a field's help is searched in, whatever the page's (settings.LANGUAGES).
SEARCH_LANGUAGES = ("zh-hans", "en")
LONG_TEXT = 30  # str defaults longer than this (the persona) get a textarea


@dataclass
class Fieldset:
    name: str
    title: str
    doc: str
    fields: list[forms.BoundField]


def _kind(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin in (list, typing.List):  # noqa: UP006 - both spellings may appear
        return "list"
    if origin in (dict, typing.Dict):  # noqa: UP006 - both spellings may appear
        return "dict"
    if origin in (typing.Union, types.UnionType):
        raise TypeError(f"config fields may not be unions: {annotation}")
    return {str: "str", int: "int", float: "float", bool: "bool"}[annotation]


def translated_help(info: FieldInfo) -> str:
    """A field's description in the request's language. core.config marks every description (and each
    section's docstring) with gettext_noop, so `make messages` puts them in the console's catalog keyed by
    the English text, which stays the one source (the TOML template's comments are that English); the
    editor looks the text up here, at render time. (That it needs a restart shows as the badge.)"""
    return gettext(info.description) if info.description else ""


def translated_title(info: FieldInfo, key: str) -> str:
    """A field's (or a section's) readable label in the request's language: its title, marked with
    gettext_noop like the description (every config field has one: tests/console/test_console_config_labels.py).
    The key is shown beside it, as the operator writes it in bot_config.toml."""
    return gettext(info.title) if info.title else key


def search_text(section: str, key: str, info: FieldInfo) -> str:
    """What the form's search looks in for a field: its section and key, and its label, its section's title
    and its help, each in Chinese and in English (an operator may look for 超时 or for timeout, whatever the
    page's language)."""
    parts = [section, key, f"{section}.{key}"]
    section_info = BotConfig.model_fields[section]
    for language in SEARCH_LANGUAGES:
        with translation.override(language):
            parts += [translated_title(info, key), translated_title(section_info, section), translated_help(info)]
    return " ".join(dict.fromkeys(p for p in parts if p)).lower()


def _form_field(info: FieldInfo, default: Any) -> forms.Field:
    common = {"help_text": translated_help(info), "label_suffix": ""}
    if item := table_item(info.annotation):
        return TableField(item, **common)
    if is_routes(info.annotation):
        return RoutesField(required=False, widget=forms.Textarea(attrs={"rows": 4, "cols": 60}), **common)
    kind = _kind(info.annotation)
    if kind == "bool":
        return forms.BooleanField(required=False, **common)
    if kind == "int":
        return forms.IntegerField(**common)
    if kind == "float":
        return forms.FloatField(**common)
    if kind in ("list", "dict"):
        textarea = forms.Textarea(attrs={"rows": 3, "cols": 60})
        return LinesField("map" if kind == "dict" else "list", required=False, widget=textarea, **common)
    widget = (
        forms.Textarea(attrs={"rows": 3, "cols": 80})
        if len(str(default)) > LONG_TEXT
        else forms.TextInput(attrs={"size": 60})
    )
    return forms.CharField(required=False, strip=False, widget=widget, **common)


class LinesField(forms.CharField):
    """A list[str] (one item per line) or a dict[str, str] (one `name = value` per line) as a textarea."""

    def __init__(self, kind: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kind = kind

    def prepare_value(self, value: Any) -> Any:
        return cell_text(value, self.kind)

    def to_python(self, value: Any) -> Any:
        return parse_cell(super().to_python(value) or "", self.kind)


def _form_fields(model: type) -> list[tuple[str, FieldInfo]]:
    """The fields the form edits: every one (tables of their own as tables: console.config_tables)."""
    return list(model.model_fields.items())


def _sections() -> list[tuple[str, type]]:
    return [(name, f.annotation) for name, f in BotConfig.model_fields.items()]


class ConfigForm(forms.Form):
    """One form field per config field; sections become fieldsets; pydantic's own validation runs in
    clean() and its errors land on the field they are about.

    Each field carries the value the operator was shown (show_hidden_initial), so a save applies only
    what the operator changed, on top of `base` (the file as it is now): an edit made to the file
    meanwhile, by hand or by another operator, is kept.
    """

    def __init__(self, *args: Any, base: BotConfig, secrets: Secrets, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.base = base
        self.secrets = secrets
        defaults = BotConfig()
        for section, model in _sections():
            for key, info in _form_fields(model):
                field = _form_field(info, getattr(getattr(defaults, section), key))
                field.label = translated_title(info, key)
                field.config_key = key
                field.show_hidden_initial = True
                field.requires_restart = requires_restart(info)
                field.search_text = search_text(section, key, info)
                self.fields[f"{section}{SEP}{key}"] = field
        self.config: BotConfig | None = None

    @classmethod
    def from_config(cls, cfg: BotConfig, secrets: Secrets) -> ConfigForm:
        dumped = cfg.model_dump()
        initial = {
            f"{section}{SEP}{key}": redact_data(value, secrets, tagged=True, path=(section, key))
            for section, model in _sections()
            for key, value in dumped[section].items()
        }
        return cls(initial=initial, base=cfg, secrets=secrets)

    def fieldsets(self) -> list[Fieldset]:
        return [
            Fieldset(
                name=section,
                title=translated_title(BotConfig.model_fields[section], section),
                doc=gettext(model.__doc__).strip() if model.__doc__ else "",
                fields=[self[f"{section}{SEP}{key}"] for key, _ in _form_fields(model)],
            )
            for section, model in _sections()
        ]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        values = self.base.model_dump()
        for name in self.changed_data:
            if name in cleaned:  # a field that failed its type check keeps the base value here
                section, key = name.split(SEP, 1)
                try:  # a redacted secret left in an edited field gets its value back (only there)
                    values[section][key] = restore_data(
                        cleaned[name], values[section][key], self.secrets, path=(section, key)
                    )
                except ConfigError as exc:
                    self.add_error(name, str(exc))
        # Validated even when some fields already failed, so every wrong field is reported at once.
        try:
            config = BotConfig.model_validate(values)
        except ValidationError as exc:
            for err in exc.errors():
                loc = [str(p) for p in err["loc"]]
                name = SEP.join(loc[:2])
                if name in self.fields:
                    if name not in self.errors:
                        self.add_error(name, _where(err["loc"][2:], err["msg"]))
                else:
                    self.add_error(None, f"{'.'.join(loc)}: {err['msg']}")
        else:
            if not self.errors:
                self.config = config
        return cleaned


def _where(place: tuple, message: str) -> str:
    """A validation message, with the row (1-based) and column of a table's cell, or a map's key."""
    if not place:
        return message
    if isinstance(place[0], int):
        where = gettext("row %(row)d") % {"row": place[0] + 1}
        place = place[1:]
    else:
        where = ""
    parts = [where, *(str(p) for p in place)]
    return f"{', '.join(p for p in parts if p)}: {message}"


def toml_with_values(text: str, cfg: BotConfig) -> str:
    """`text` (the current file) with the values of `cfg` written in: only values that differ are
    touched, so comments, order and formatting of everything else stay as they were."""
    doc = tomlkit.parse(text)
    for section, key in RETIRED_KEYS:  # saving from the form drops what the config no longer reads
        table = doc.get(section)
        if table is not None and key in table:
            del table[key]
    defaults = BotConfig().model_dump()
    models = dict(_sections())
    for section, values in cfg.model_dump().items():
        table = doc.get(section)
        for key, value in values.items():
            info = models[section].model_fields[key]
            typed = getattr(getattr(cfg, section), key)
            if table is not None and key in table:
                current = table[key]
                if not same_value(info, current.unwrap() if hasattr(current, "unwrap") else current, typed):
                    table[key] = toml_value(typed)
            elif value != defaults[section][key]:
                if table is None:
                    doc.add(tomlkit.nl())
                    doc.add(section, tomlkit.table())
                    table = doc[section]
                table[key] = toml_value(typed)
    return tomlkit.dumps(doc)


def read_config_file() -> tuple[str, BotConfig | None, str]:
    """The config file's text, the config it holds (None when invalid) and its error."""
    path = ensure_config_file(config_path())  # deleted meanwhile: start again from the template
    text = path.read_text(encoding="utf-8")
    try:
        return text, parse_config(text, source=path.name), ""
    except ConfigError as exc:
        return text, None, str(exc)


def file_secrets(text: str) -> Secrets:
    """The secrets to redact from the file `text` (it may be broken) and from the config in force."""
    try:
        data = tomlkit.parse(text).unwrap()
    except Exception:
        data = {}
    return Secrets.of(data, get_config().model_dump(mode="json"))


def file_notices(text: str) -> list[str]:
    """What the operator should know about the file beyond its errors (retired keys it still holds)."""
    try:
        return retired_keys(tomlkit.parse(text).unwrap())
    except Exception:
        return []
