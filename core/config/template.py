"""The one source of the config's documentation: the template comments and the console editor's help
texts, both made from the fields' descriptions."""

from __future__ import annotations

from typing import Any

import tomlkit

from core.config.model import BotConfig


def requires_restart(field: Any) -> bool:
    """A field marked `json_schema_extra={"requires_restart": True}` is read once at start-up, so a hot
    reload does not change it. Components read get_config() on each use, so only the watcher's own
    `console.reload_debounce_ms` needs this."""
    extra = field.json_schema_extra
    return bool(isinstance(extra, dict) and extra.get("requires_restart"))


def is_table(field: Any) -> bool:
    """A field of tables of its own (e.g. [[llm.models]]): documented in the template, absent until set."""
    extra = field.json_schema_extra
    return bool(isinstance(extra, dict) and extra.get("table"))


def field_help(field: Any) -> str:
    """The help text of a config field, as the template comment and the editor show it."""
    text = field.description or ""
    if requires_restart(field):
        text = f"{text} (Takes effect after a restart.)".strip()
    return text


# --- template -------------------------------------------------------------------------------------

# Where the docs site explains a section's tables ([[llm.models]], [[mcp.servers]], ...).
TABLES_DOCUMENTED_IN = {"llm": "docs/bot.md", "chat": "docs/bot.md", "mcp": "docs/api.md", "plugins": "docs/plugins.md"}


def render_template() -> str:
    """The commented bot_config.toml template, generated from the model's descriptions."""
    doc = tomlkit.document()
    doc.add(tomlkit.comment("maibot bot configuration. Generated from core/config/: edit the"))
    doc.add(tomlkit.comment("descriptions there, then run `python manage.py write_config_template`."))
    defaults = BotConfig()
    for name, field in BotConfig.model_fields.items():
        section_model = field.annotation
        table = tomlkit.table()
        if section_model.__doc__:
            table.add(tomlkit.comment(section_model.__doc__.strip()))
        section_value = getattr(defaults, name)
        for key, sub in section_model.model_fields.items():
            if is_table(sub):
                # Tables of their own ([[llm.models]], ...): documented here, absent until written.
                page = TABLES_DOCUMENTED_IN.get(name, "docs/index.md")
                table.add(tomlkit.comment(f"{key}: {field_help(sub)} None by default; see {page}."))
                continue
            if field_help(sub):
                table.add(tomlkit.comment(field_help(sub)))
            value = getattr(section_value, key)
            if isinstance(value, dict):
                # An inline table, so the keys after it stay in this section.
                inline = tomlkit.inline_table()
                inline.update(value)
                value = inline
            table.add(key, value)
        doc.add(tomlkit.nl())
        doc.add(name, table)
    return tomlkit.dumps(doc)
