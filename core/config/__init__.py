"""The bot's own configuration (bot_config.toml in the data dir): its model (sections, services, operations, model),
loading and the one object everything reads it through (`get_config()`, loading), and its documentation
(template).

Each field's description is its documentation: the commented template in config/ is generated from it.
Everything is imported from here (`from core.config import get_config`); the modules are its parts.
"""

from core.config.base import ConfigError, Section
from core.config.entries import (
    DEFAULT_MODEL,
    LLM_TASKS,
    Budget,
    McpServerEntry,
    ModelEntry,
    PluginLimitsEntry,
    TalkRule,
    mcp_secret_resolve,
    mcp_secret_variables,
)
from core.config.loading import (
    RETIRED_KEYS,
    TEMPLATE_PATH,
    config_path,
    ensure_config_file,
    get_config,
    load_config,
    override,
    parse_config,
    private_write,
    reload_config,
    retired_keys,
    set_config,
)
from core.config.model import BotConfig, LLMModel
from core.config.operations import ConsoleSection, LifeSection, SchedulingSection
from core.config.sections import TABLE, BotSection, ChatSection, LLMSection
from core.config.services import ApiSection, GatewaySection, McpSection, PluginsSection
from core.config.template import field_help, is_table, render_template, requires_restart
from core.deployment_env import llm_key_variables
from core.text import format_instant, format_shown

__all__ = [
    "DEFAULT_MODEL",
    "LLM_TASKS",
    "RETIRED_KEYS",
    "TABLE",
    "TEMPLATE_PATH",
    "ApiSection",
    "BotConfig",
    "BotSection",
    "Budget",
    "ChatSection",
    "ConfigError",
    "ConsoleSection",
    "GatewaySection",
    "LLMModel",
    "LLMSection",
    "LifeSection",
    "McpSection",
    "McpServerEntry",
    "ModelEntry",
    "PluginLimitsEntry",
    "PluginsSection",
    "SchedulingSection",
    "Section",
    "TalkRule",
    "config_path",
    "ensure_config_file",
    "field_help",
    "format_instant",
    "format_shown",
    "get_config",
    "is_table",
    "llm_key_variables",
    "load_config",
    "mcp_secret_resolve",
    "mcp_secret_variables",
    "override",
    "parse_config",
    "private_write",
    "reload_config",
    "render_template",
    "requires_restart",
    "retired_keys",
    "set_config",
]
