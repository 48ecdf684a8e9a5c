"""The config editor's tables (console.config_tables): models, task routes, budgets, talk rules, MCP servers
and per-plugin limits edited in the form as an operator does, with the same validation, permissions and
secret handling as the TOML editor; errors name the row and column, and nothing is written then."""

from __future__ import annotations

import pytest

from core.config import get_config, parse_config
from tests.console import test_console_config_editor as editor_tests
from tests.console.test_console_config_editor import NOTE, form_data

config_file, operator, config_editor = editor_tests.config_file, editor_tests.operator, editor_tests.config_editor

pytestmark = pytest.mark.backend_independent

MODELS_TOML = """
[[llm.models]]
# the cheap one, for summaries
name = "cheap"
model = "gpt-4o-mini"

[[llm.models]]
name = "big"
model = "gpt-4o"
price_input_per_1m = 2.5
"""
SERVER_TOML = """
[[mcp.servers]]
name = "search"
url = "https://mcp.example/api"
headers = { Authorization = "Bearer s3cret-token-value" }
tools = ["search"]
"""


def _save(client, changes: dict[str, str]):
    return client.post("/admin/config/", form_data(client) | changes)


def test_an_operator_adds_a_model_its_route_and_a_budget_in_the_form(config_file, operator):
    response = _save(
        operator,
        {
            "llm__models-0-name": "backup",
            "llm__models-0-model": "deepseek-chat",
            "llm__models-0-price_input_per_1m": "0.27",
            "llm__tasks": "planner = default, backup\nsummary = backup",
            "llm__budgets-0-scope": "model",
            "llm__budgets-0-target": "backup",
            "llm__budgets-0-daily_tokens": "100000",
            "chat__talk_frequency_rules-0-start": "00:00",
            "chat__talk_frequency_rules-0-end": "08:00",
            "chat__talk_frequency_rules-0-talk_frequency": "0",
        },
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    cfg = get_config().llm
    (model,) = cfg.models
    assert (model.name, model.model, model.price_input_per_1m, model.timeout) == ("backup", "deepseek-chat", 0.27, 120)
    assert cfg.tasks == {"planner": ["default", "backup"], "summary": ["backup"]}
    assert (cfg.budgets[0].scope, cfg.budgets[0].target, cfg.budgets[0].daily_tokens) == ("model", "backup", 100000)
    assert get_config().chat.talk_frequency_rules[0].end == "08:00"
    text = config_file.read_text(encoding="utf-8")
    assert "[[llm.models]]" in text and "[[llm.budgets]]" in text and NOTE in text
    models_block = text[text.index("[[llm.models]]") : text.index("[[llm.budgets]]")]
    assert "timeout" not in models_block  # a default is not written out


def test_a_bad_cell_names_its_row_and_column_and_nothing_is_written(config_file, operator):
    before = config_file.read_text(encoding="utf-8")
    page = _save(
        operator,
        {
            "llm__models-0-name": "ok",
            "llm__models-0-model": "gpt-4o-mini",
            "llm__models-1-name": "bad",
            "llm__models-1-model": "gpt-4o",
            "llm__models-1-price_input_per_1m": "a lot",
        },
    ).content.decode()
    assert "row 2, price_input_per_1m:" in page
    assert config_file.read_text(encoding="utf-8") == before and get_config().llm.models == []
    # The rows are shown again as typed, to be corrected.
    assert 'value="a lot"' in page


def test_a_route_to_no_model_and_a_budget_without_a_cap_are_refused(config_file, operator):
    before = config_file.read_text(encoding="utf-8")
    page = _save(operator, {"llm__budgets-0-scope": "session"}).content.decode()
    assert "row 1: " in page and "daily_tokens or daily_cost" in page
    page = _save(operator, {"llm__tasks": "planner ="}).content.decode()
    assert "planner" in page and "1 to 20 model names" in page
    assert config_file.read_text(encoding="utf-8") == before


def test_a_row_ticked_remove_goes_and_an_unchanged_table_stays_as_written(config_file, operator):
    config_file.write_text(config_file.read_text(encoding="utf-8") + MODELS_TOML, encoding="utf-8")
    page = operator.get("/admin/config/").content.decode()
    assert 'value="cheap"' in page and 'value="big"' in page and 'value="2.5"' in page
    assert _save(operator, {"chat__max_rounds": "4"}).status_code == 302
    assert MODELS_TOML in config_file.read_text(encoding="utf-8")  # its comment too
    assert _save(operator, {"llm__models-0-remove": "on"}).status_code == 302
    assert [m.name for m in parse_config(config_file.read_text(encoding="utf-8")).llm.models] == ["big"]


def test_a_post_without_the_tables_changes_none_of_them(config_file, operator):
    config_file.write_text(config_file.read_text(encoding="utf-8") + MODELS_TOML, encoding="utf-8")
    data = {k: v for k, v in form_data(operator).items() if not k.startswith("llm__models")}
    assert operator.post("/admin/config/", data | {"chat__max_rounds": "4"}).status_code == 302
    assert [m.name for m in get_config().llm.models] == ["cheap", "big"]


def test_a_model_pointed_elsewhere_needs_the_provider_permission(config_file, config_editor):
    client, _ = config_editor
    before = config_file.read_text(encoding="utf-8")
    page = _save(
        client,
        {
            "llm__models-0-name": "exfil",
            "llm__models-0-model": "gpt-4o",
            "llm__models-0-base_url": "https://attacker.example/v1",
        },
    ).content.decode()
    assert "Can change the model provider" in page
    assert config_file.read_text(encoding="utf-8") == before and get_config().llm.models == []


def test_a_servers_secret_header_is_never_shown_and_survives_a_save(config_file, operator):
    config_file.write_text(config_file.read_text(encoding="utf-8") + SERVER_TOML, encoding="utf-8")
    page = operator.get("/admin/config/").content.decode()
    assert "s3cret-token-value" not in page and "mcp__servers-0-headers" in page
    assert _save(operator, {"mcp__servers-0-tools": "search\nfetch"}).status_code == 302
    text = config_file.read_text(encoding="utf-8")
    (server,) = parse_config(text).mcp.servers
    assert server.headers == {"Authorization": "Bearer s3cret-token-value"} and server.tools == ["search", "fetch"]
    # A placeholder moved to another server stands for nothing there: refused, nothing written.
    shown = form_data(operator)["mcp__servers-0-headers"]
    page = _save(
        operator,
        {"mcp__servers-1-name": "copy", "mcp__servers-1-url": "https://evil.example/", "mcp__servers-1-headers": shown},
    ).content.decode()
    assert "s3cret-token-value" not in page
    assert config_file.read_text(encoding="utf-8") == text
