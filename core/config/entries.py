"""The entries of the config's tables of their own ([[llm.models]], [[llm.budgets]],
[[chat.talk_frequency_rules]], [[mcp.servers]], [[plugins.limits]]) and the names they use: one pydantic
model each; a field's description is its documentation, its title the console's column."""

from __future__ import annotations

import os
import re
from typing import Annotated, Literal

from django.utils.translation import gettext_noop
from pydantic import Field, field_validator, model_validator

from core.config.base import Section
from core.deployment_env import llm_key_variables

# What calls a model: the chat planner, the life loop, chat summaries, and anything else (utility).
LLM_TASKS = ("planner", "life", "summary", "utility")
LLMTask = Literal["planner", "life", "summary", "utility"]
ModelName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
# The single model of `[llm]` itself (base_url, model, ...), when one is set.
DEFAULT_MODEL = "default"


def _check_key_variable(value: str) -> str:
    # The key's variable is the deployment's choice, not the console's: otherwise whoever may edit
    # the config could point it at any secret in the environment and send it to a URL of theirs.
    allowed = llm_key_variables()
    if value not in allowed:
        raise ValueError(
            f"{value!r} is not an allowed API key variable (allowed: {', '.join(sorted(allowed))}; "
            "the deployment lists others in MAIBOT_LLM_KEY_ENVS)"
        )
    return value


class ModelEntry(Section):
    """One named model a task may be routed to (`[[llm.models]]`)."""

    name: ModelName = Field(
        description=gettext_noop("The name tasks and budgets refer to."), title=gettext_noop("Name")
    )
    base_url: str = Field(
        "",
        max_length=2048,
        description=gettext_noop("API base URL. Empty: llm.base_url."),
        title=gettext_noop("API base URL"),
    )
    api_key_env: str = Field(
        "OPENAI_API_KEY",
        min_length=1,
        max_length=128,
        description=gettext_noop("Key variable."),
        title=gettext_noop("API key variable"),
    )
    model: str = Field(
        min_length=1, max_length=256, description=gettext_noop("The provider's model id."), title=gettext_noop("Model")
    )
    price_input_per_1m: float = Field(
        0.0,
        ge=0,
        le=10_000,
        description=gettext_noop("Price per 1M prompt tokens."),
        title=gettext_noop("Price per 1M prompt tokens"),
    )
    price_output_per_1m: float = Field(
        0.0,
        ge=0,
        le=10_000,
        description=gettext_noop("Price per 1M completion tokens."),
        title=gettext_noop("Price per 1M completion tokens"),
    )
    timeout: float = Field(
        120.0,
        gt=0,
        le=3600,
        description=gettext_noop("Seconds before one call times out."),
        title=gettext_noop("Call timeout (seconds)"),
    )
    max_concurrent: int = Field(
        4,
        ge=1,
        le=1000,
        description=gettext_noop("Calls in flight at once per process."),
        title=gettext_noop("Calls at once"),
    )

    @field_validator("api_key_env")
    @classmethod
    def _allowed_key_variable(cls, value: str) -> str:
        return _check_key_variable(value)

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, value: str) -> str:
        if value == DEFAULT_MODEL:
            raise ValueError(f"{DEFAULT_MODEL!r} is the name of the single model of [llm] itself")
        return value


class Budget(Section):
    """A daily cap (`[[llm.budgets]]`), counted from local midnight in the bot's time zone."""

    scope: Literal["model", "task", "session"] = Field(
        description=gettext_noop("What the cap counts: model, task or session."), title=gettext_noop("Counts")
    )
    target: str = Field(
        "",
        max_length=64,
        description=gettext_noop("The model's or the task's name; empty for a session cap (it holds for each chat)."),
        title=gettext_noop("Target"),
    )
    daily_tokens: int = Field(
        0,
        ge=0,
        le=10**12,
        description=gettext_noop("Prompt + completion tokens per day (0: no cap)."),
        title=gettext_noop("Tokens per day"),
    )
    daily_cost: float = Field(
        0.0,
        ge=0,
        le=10**7,
        description=gettext_noop("Cost per day, in the prices' currency (0: no cap)."),
        title=gettext_noop("Cost per day"),
    )

    @model_validator(mode="after")
    def _meaningful(self) -> Budget:
        if not self.daily_tokens and not self.daily_cost:
            raise ValueError("a budget needs daily_tokens or daily_cost")
        if self.scope == "task" and self.target not in LLM_TASKS:
            raise ValueError(f"a task budget's target is one of {', '.join(LLM_TASKS)}")
        if self.scope == "model" and not self.target:
            raise ValueError("a model budget names its model in target")
        if self.scope == "session" and self.target:
            raise ValueError("a session budget holds for each chat: leave target empty")
        return self


_HHMM = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"


class TalkRule(Section):
    """talk_frequency for a chat and/or a time window (e.g. quiet hours 00:00-08:00 -> 0)."""

    chat: str = Field(
        "",
        max_length=200,
        description=gettext_noop("platform:group:ID or platform:private:ID; empty: every chat."),
        title=gettext_noop("Chat"),
    )
    start: str = Field(
        "00:00",
        max_length=5,
        pattern=_HHMM,
        description=gettext_noop("Window start, local time (HH:MM)."),
        title=gettext_noop("From"),
    )
    end: str = Field(
        "00:00",
        max_length=5,
        pattern=_HHMM,
        description=gettext_noop("Window end, exclusive (HH:MM)."),
        title=gettext_noop("Until"),
    )
    talk_frequency: float = Field(
        ge=0,
        le=1,
        description=gettext_noop("The talk_frequency in force in the window."),
        title=gettext_noop("Talk frequency"),
    )


_ENV_NAME = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
_SECRET_REF = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")


def mcp_secret_variables() -> set[str]:
    """Environment variables an MCP server's env or headers may name as ${NAME} (set by the deployment)."""
    return {name.strip() for name in os.environ.get("MAIBOT_MCP_SECRET_ENVS", "").split(",") if name.strip()}


def mcp_secret_resolve(value: str) -> str:
    """A header or env value with a ${NAME} reference replaced by that variable's value."""
    match = _SECRET_REF.match(value)
    return os.environ.get(match[1], "") if match else value


class McpServerEntry(Section):
    """One MCP server whose tools the bot may use ([[mcp.servers]])."""

    name: str = Field(
        min_length=1,
        max_length=24,
        pattern=r"^[a-z][a-z0-9_]*$",
        description=gettext_noop("Unique short name; its tools are offered to the model as <name>__<tool>."),
        title=gettext_noop("Name"),
    )
    enabled: bool = Field(
        True, description=gettext_noop("false: not started; its tools are not offered."), title=gettext_noop("Enabled")
    )
    command: str | None = Field(
        None,
        min_length=1,
        max_length=1024,
        description=gettext_noop("stdio transport: the program to start (give this or url)."),
        title=gettext_noop("Command"),
    )
    args: list[Annotated[str, Field(max_length=1024)]] = Field(
        default_factory=list,
        max_length=64,
        description=gettext_noop("stdio transport: the program's arguments."),
        title=gettext_noop("Arguments"),
    )
    env: dict[_ENV_NAME, Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=dict,
        max_length=64,
        description=gettext_noop(
            "stdio transport: extra environment variables. A value ${NAME} is read from this process's "
            "environment, for a NAME the deployment lists in MAIBOT_MCP_SECRET_ENVS (keep secrets out of this file)."
        ),
        title=gettext_noop("Environment"),
    )
    url: str | None = Field(
        None,
        max_length=2048,
        pattern=r"^https?://",
        description=gettext_noop("Streamable-HTTP transport: the server's endpoint URL (give this or command)."),
        title=gettext_noop("URL"),
    )
    headers: dict[Annotated[str, Field(min_length=1, max_length=128)], Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=dict,
        max_length=64,
        description=gettext_noop("Streamable-HTTP transport: extra request headers (a value ${NAME}: as in env)."),
        title=gettext_noop("Headers"),
    )
    tools: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(
        default_factory=lambda: ["*"],
        max_length=200,
        description=gettext_noop('The server\'s tools the model is offered (its own names); ["*"]: all of them.'),
        title=gettext_noop("Tools"),
    )
    scopes: list[Annotated[str, Field(pattern=r"^(chat|life)$")]] = Field(
        default_factory=lambda: ["chat"],
        max_length=2,
        description=gettext_noop(
            "Where its tools are offered: chat (the chat planner, connected by the server process), life "
            "(the life loop, connected by each cluster worker on its first turn)."
        ),
        title=gettext_noop("Offered to"),
    )
    call_timeout_seconds: float = Field(
        30.0,
        ge=0.5,
        le=600,
        description=gettext_noop("How long one tool call may take before it fails with tool_timeout."),
        title=gettext_noop("Call timeout (seconds)"),
    )
    connect_timeout_seconds: float = Field(
        20.0,
        ge=1,
        le=300,
        description=gettext_noop("How long starting or connecting to the server may take."),
        title=gettext_noop("Connect timeout (seconds)"),
    )

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerEntry:
        if (self.url is None) == (self.command is None):
            raise ValueError("give exactly one of command (stdio) or url (streamable HTTP)")
        # Like llm.api_key_env: whoever edits the config may not send any secret of the environment
        # to a server of theirs, only those the deployment set aside for MCP servers.
        allowed = mcp_secret_variables()
        for value in (*self.env.values(), *self.headers.values()):
            match = _SECRET_REF.match(value)
            if match and match[1] not in allowed:
                raise ValueError(
                    f"{match[1]!r} is not an allowed secret variable (the deployment lists them in "
                    "MAIBOT_MCP_SECRET_ENVS)"
                )
        return self


class PluginLimitsEntry(Section):
    """One plugin's own limits ([[plugins.limits]]); a key left out keeps the [plugins] value."""

    plugin: str = Field(
        min_length=1,
        max_length=200,
        description=gettext_noop("The plugin's id (its manifest's id)."),
        title=gettext_noop("Plugin"),
    )
    network: str | None = Field(
        None,
        max_length=16,
        pattern=r"^(isolated|none)$",
        description=gettext_noop("As plugins.network."),
        title=gettext_noop("Network"),
    )
    runner_memory_mb: int | None = Field(
        None,
        ge=0,
        le=65_536,
        description=gettext_noop("As plugins.runner_memory_mb."),
        title=gettext_noop("Memory (MB)"),
    )
    runner_cpu_seconds_per_minute: float | None = Field(
        None,
        ge=1,
        le=3600,
        description=gettext_noop("As plugins.runner_cpu_seconds_per_minute."),
        title=gettext_noop("CPU seconds per minute"),
    )
    runner_max_processes: int | None = Field(
        None,
        ge=8,
        le=4096,
        description=gettext_noop("As plugins.runner_max_processes."),
        title=gettext_noop("Processes"),
    )
    runner_max_open_files: int | None = Field(
        None,
        ge=32,
        le=65_536,
        description=gettext_noop("As plugins.runner_max_open_files."),
        title=gettext_noop("Open files"),
    )
    runner_max_file_mb: int | None = Field(
        None,
        ge=1,
        le=65_536,
        description=gettext_noop("As plugins.runner_max_file_mb."),
        title=gettext_noop("Largest file (MB)"),
    )
    sends_per_minute: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description=gettext_noop("As plugins.sends_per_minute."),
        title=gettext_noop("Sends per minute"),
    )
    media_mb_per_minute: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description=gettext_noop("As plugins.media_mb_per_minute."),
        title=gettext_noop("Media MB per minute"),
    )
