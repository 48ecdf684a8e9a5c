"""The bot's own configuration (bot_config.toml in the data dir): its model, loading and the one object
everything reads it through (`get_config()`).

Each field's description is its documentation: the commented template in config/ is generated from it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from datetime import datetime, tzinfo
from pathlib import Path
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import tomlkit
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

TEMPLATE_PATH = Path(__file__).resolve().parent.parent / "config" / "bot_config.toml"
logger = logging.getLogger(__name__)


class ConfigError(Exception):
    """The config file cannot be used; the message names the key and the problem."""


class Section(BaseModel):
    # Every number has finite bounds (inf and nan are refused everywhere), every text a length limit:
    # a value the config accepts never overflows a date, a timeout or a prompt (tests/test_config.py
    # walks the fields).
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class BotSection(Section):
    """Who the bot is."""

    nickname: str = Field("麦麦", min_length=1, max_length=64, description="The bot's name in chats.")
    alias_names: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        default_factory=lambda: ["MaiBot", "麦麦"],
        max_length=50,
        description="Other names that count as mentioning the bot in a group chat.",
    )
    platform_accounts: dict[
        Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")],
        Annotated[str, Field(min_length=1, max_length=128)],
    ] = Field(
        default_factory=dict,
        max_length=50,
        description=(
            'The bot\'s own account id on each platform, e.g. {qq = "123456"}: `@<any name:that id>` is a '
            "mention, and group messages are sent as that account. Unset: what the adapter tells, if it does."
        ),
    )
    language: str = Field(
        "zh",
        max_length=16,
        pattern=r"^[a-z]{2}(-[A-Za-z]{2,4})?$",
        description="The language the bot speaks (BCP 47, e.g. zh or en). Fixed texts follow it.",
    )
    persona: str = Field(
        "你是麦麦，一个友善、简洁、有点俏皮的大学生。说话口语化，不长篇大论。",
        min_length=1,
        max_length=8000,
        description="The persona given to the model at the top of every prompt.",
    )
    time_zone: str = Field(
        "",
        max_length=64,
        description=(
            "IANA time zone the bot lives in (times without an offset are read in it). "
            "Empty: the MAIBOT_TIME_ZONE environment setting."
        ),
    )

    @field_validator("time_zone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        if value:
            try:
                ZoneInfo(value)
            except (ZoneInfoNotFoundError, ValueError) as exc:
                raise ValueError(f"unknown time zone {value!r}") from exc
        return value


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

    name: ModelName = Field(description="The name tasks and budgets refer to.")
    base_url: str = Field("", max_length=2048, description="API base URL. Empty: llm.base_url.")
    api_key_env: str = Field("OPENAI_API_KEY", min_length=1, max_length=128, description="Key variable.")
    model: str = Field(min_length=1, max_length=256, description="The provider's model id.")
    price_input_per_1m: float = Field(0.0, ge=0, le=10_000, description="Price per 1M prompt tokens.")
    price_output_per_1m: float = Field(0.0, ge=0, le=10_000, description="Price per 1M completion tokens.")
    timeout: float = Field(120.0, gt=0, le=3600, description="Seconds before one call times out.")
    max_concurrent: int = Field(4, ge=1, le=1000, description="Calls in flight at once per process.")

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

    scope: Literal["model", "task", "session"] = Field(description="What the cap counts: model, task or session.")
    target: str = Field(
        "",
        max_length=64,
        description="The model's or the task's name; empty for a session cap (it holds for each chat).",
    )
    daily_tokens: int = Field(0, ge=0, le=10**12, description="Prompt + completion tokens per day (0: no cap).")
    daily_cost: float = Field(0.0, ge=0, le=10**7, description="Cost per day, in the prices' currency (0: no cap).")

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


# Fields too structured for the console's form: edited in the TOML editor (/admin/config/raw/).
RAW_ONLY = {"raw_only": True}


class LLMSection(Section):
    """The OpenAI-compatible models the planner, the life loop and summaries call, and their budgets.

    The single model of this section (base_url, model, ...) is named "default". More models go in
    [[llm.models]]; [llm.tasks] routes each task to an ordered list of them (the first that answers
    wins); [[llm.budgets]] caps daily spend. See README "Cost control".
    """

    base_url: str = Field(
        "", max_length=2048, description="API base URL, e.g. https://api.openai.com/v1 (OPENAI_BASE_URL overrides)."
    )
    model: str = Field("", max_length=256, description="Model name. Empty: offline mode (MAIBOT_LLM_MODEL overrides).")
    api_key_env: str = Field(
        "OPENAI_API_KEY",
        min_length=1,
        max_length=128,
        description=(
            "Name of the environment variable holding the API key: OPENAI_API_KEY, or one the deployment "
            "allows in MAIBOT_LLM_KEY_ENVS (comma-separated)."
        ),
    )
    timeout: float = Field(120.0, gt=0, le=3600, description="Seconds before one LLM call times out.")
    max_retries: int = Field(2, ge=0, le=10, description="Retries the SDK makes on connection errors and 5xx.")
    temperature: float = Field(0.7, ge=0, le=2, description="Sampling temperature.")
    price_input_per_1m: float = Field(
        0.0, ge=0, le=10_000, description="Price per 1M prompt tokens (for the cost ledger)."
    )
    price_output_per_1m: float = Field(
        0.0, ge=0, le=10_000, description="Price per 1M completion tokens (for the cost ledger)."
    )

    models: list[ModelEntry] = Field(
        default_factory=list,
        max_length=20,
        description="More models ([[llm.models]]: name, base_url, api_key_env, model, prices, timeout, "
        "max_concurrent), edited in the TOML editor.",
        json_schema_extra=RAW_ONLY,
    )
    tasks: dict[LLMTask, list[ModelName]] = Field(
        default_factory=dict,
        max_length=len(LLM_TASKS),
        description="Each task (planner, life, summary, utility) to an ordered list of model names: a provider "
        'error or timeout tries the next. Unlisted tasks use "default" (this section\'s model), else the '
        "first of [[llm.models]].",
        json_schema_extra=RAW_ONLY,
    )
    budgets: list[Budget] = Field(
        default_factory=list,
        max_length=100,
        description="Daily caps ([[llm.budgets]]: scope model | task | session, target, daily_tokens, daily_cost). "
        "A call that would run past one is not made. None by default.",
        json_schema_extra=RAW_ONLY,
    )

    @field_validator("api_key_env")
    @classmethod
    def _allowed_key_variable(cls, value: str) -> str:
        return _check_key_variable(value)

    @field_validator("tasks")
    @classmethod
    def _routes_not_empty(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        for task, names in value.items():
            if not names or len(names) > 20:
                raise ValueError(f"task {task!r} needs 1 to 20 model names")
        return value

    @model_validator(mode="after")
    def _names_known(self) -> LLMSection:
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError("two [[llm.models]] share a name")
        known = {*names, DEFAULT_MODEL}
        for task, route in self.tasks.items():
            unknown = [n for n in route if n not in known]
            if unknown:
                raise ValueError(f"task {task!r} names unknown model(s): {', '.join(unknown)}")
        for budget in self.budgets:
            if budget.scope == "model" and budget.target not in known:
                raise ValueError(f"a budget names the unknown model {budget.target!r}")
        return self


def llm_key_variables() -> set[str]:
    """Environment variables the config may name as the LLM API key (set by the deployment)."""
    extra = os.environ.get("MAIBOT_LLM_KEY_ENVS", "")
    return {"OPENAI_API_KEY", *(name.strip() for name in extra.split(",") if name.strip())}


_HHMM = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"


class TalkRule(Section):
    """talk_frequency for a chat and/or a time window (e.g. quiet hours 00:00-08:00 -> 0)."""

    chat: str = Field("", max_length=200, description="platform:group:ID or platform:private:ID; empty: every chat.")
    start: str = Field("00:00", max_length=5, pattern=_HHMM, description="Window start, local time (HH:MM).")
    end: str = Field("00:00", max_length=5, pattern=_HHMM, description="Window end, exclusive (HH:MM).")
    talk_frequency: float = Field(ge=0, le=1, description="The talk_frequency in force in the window.")


class ChatSection(Section):
    """The per-session planner loop."""

    debounce_seconds: float = Field(
        1.0, ge=0, le=60, description="Wait this long after a message so a burst becomes one cycle."
    )
    max_rounds: int = Field(5, ge=1, le=20, description="Tool-call rounds per cycle before it must end.")
    no_reply_timeout: float = Field(
        300.0,
        gt=0,
        le=86_400,
        description=(
            "Private chats: after no_reply, seconds before the planner looks once more without a new message."
        ),
    )
    history_window: int = Field(30, ge=1, le=500, description="Recent messages shown to the planner.")
    cycle_records: int = Field(5, ge=0, le=50, description="Previous cycle records shown to the planner.")
    talk_frequency: float = Field(
        0.5,
        ge=0,
        le=1,
        description="Group chats: how readily the bot speaks unprompted (0 only when mentioned, 1 freely).",
    )
    talk_frequency_rules: list[TalkRule] = Field(
        default_factory=list,
        max_length=200,
        description="[[chat.talk_frequency_rules]]: chat (empty: every chat), start and end (HH:MM, local; "
        "equal: all day), talk_frequency. A rule for the chat beats one for every chat; then the first listed.",
        json_schema_extra=RAW_ONLY,
    )
    ignored_chats: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        default_factory=list,
        max_length=10_000,
        description="Chats whose messages are stored but never planned: platform:group:ID or platform:private:ID.",
    )
    ignored_users: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        default_factory=list,
        max_length=10_000,
        description="People whose messages are stored but never planned, anywhere: platform:USER_ID.",
    )
    command_operators: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        default_factory=list,
        max_length=1000,
        description="If set, only these accounts (platform:USER_ID) may use commands (/list, /cancel, reminders, "
        "plugin commands); others' commands are not run nor planned. Empty: everyone.",
    )
    max_runtimes: int = Field(
        10_000,
        ge=1,
        le=100_000,
        description="At most this many session loops live at once (an idle one costs ~6-10 KB and no CPU).",
    )
    idle_evict_seconds: float = Field(
        1800.0,
        gt=0,
        le=604_800,
        description="A session loop idle this long is stopped (it restarts on the next message).",
    )
    max_reply_length: int = Field(
        2000,
        ge=1,
        le=100_000,
        description="Longest chat message the model may send (longer is rambling or a data dump: refused).",
    )
    tool_timeout: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="Seconds one tool call may run before the model is told it timed out; also the longest a "
        "plugin's hook or event handler may take (one may ask for less).",
    )


class SchedulingSection(Section):
    """Scheduled private messages and their delivery."""

    horizon_days: int = Field(365, ge=1, le=3650, description="How far ahead a message may be scheduled.")
    max_text_length: int = Field(1024, ge=1, le=100_000, description="Longest scheduled message text.")
    max_pending_per_session: int = Field(20, ge=1, le=10_000, description="Pending scheduled messages per chat.")
    expire_after_seconds: int = Field(
        86400,
        ge=1,
        le=31_536_000,
        description="An overdue message older than this (e.g. after downtime) fails as expired instead of sending.",
    )
    max_attempts: int = Field(5, ge=1, le=100, description="Send attempts before a message fails.")
    retry_backoff_seconds: float = Field(
        2.0, gt=0, le=3600, description="First retry delay; each further retry doubles it."
    )
    lease_seconds: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="Backstop: a claimed message not finished within this is taken back and sent once by a "
        "cluster. One whose cluster died is taken back as soon as that cluster's heartbeat runs out "
        "(console.heartbeat_seconds).",
    )
    poll_interval: float = Field(
        0.25, gt=0, le=5, description="How often the dispatcher looks for newly due work (seconds)."
    )
    batch_size: int = Field(2000, ge=1, le=10_000, description="Messages the dispatcher claims per round.")


class GatewaySection(Section):
    """Adapter connections, the browser chat page, and delivery of outbound messages (the outbox)."""

    offline_expiry_seconds: int = Field(
        3600,
        ge=1,
        le=2_592_000,
        description="An outbound message waiting longer than this for its adapter fails (adapter_offline).",
    )
    max_backlog: int = Field(
        20_000,
        ge=10,
        le=1_000_000,
        description="Frames from one adapter connection waiting to be stored; past this the connection is "
        "flooding and is closed (1008).",
    )
    delivery_lease_seconds: float = Field(
        60.0,
        gt=0,
        le=3600,
        description="Backstop: an outbound message claimed for delivery and not marked within this is taken back "
        "(a server marks its claims within a second; one that died loses them as soon as its heartbeat runs out, "
        "see console.heartbeat_seconds). Taken back, it is handed over again where the platform's adapter echoes "
        "deliveries (within max_delivery_attempts: twice if it had reached the platform but its echo was lost), "
        "and fails as delivery_interrupted where it does not (never sent twice). Not scheduling.lease_seconds.",
    )
    outbox_poll_seconds: float = Field(
        0.2,
        gt=0,
        le=60,
        description="Without Redis: how often the server looks for outbound messages other processes wrote.",
    )
    outbox_poll_seconds_with_redis: float = Field(
        5.0,
        gt=0,
        le=300,
        description="With Redis: the safety-net poll for outbound messages (every send wakes the server at once).",
    )
    outbox_sweep_seconds: float = Field(
        1.0,
        gt=0,
        le=600,
        description="How often each server settles outbound messages past the offline expiry, past their delivery "
        "lease, or claimed by a server that died.",
    )
    confirm_seconds: float = Field(
        10.0,
        ge=1,
        le=3600,
        description="For a platform whose adapter echoes deliveries: a message handed over with no echo within "
        "this is handed over again (the wait doubles with each attempt).",
    )
    max_delivery_attempts: int = Field(
        5,
        ge=1,
        le=20,
        description="Hand-overs of one message at most, for a platform whose adapter echoes; then it is `unconfirmed`.",
    )
    keepalive_seconds: float = Field(
        15.0,
        # daphne checks its websockets every 2 s and takes its ping options in whole seconds: below 6 s
        # the promise could not be kept (maibot/management/commands/serve.py, keepalive_options).
        ge=6,
        le=300,
        description="A dead or frozen adapter (or browser page) is dropped within this: the server pings "
        "every connection that is idle (websocket ping / Engine.IO ping) and closes it when no answer comes.",
        json_schema_extra={"requires_restart": True},  # daphne and the Socket.IO server take it at start
    )
    browser_max_text_length: int = Field(
        4000, ge=1, le=100_000, description="Longest message the operator chat page (/chat/) accepts."
    )


class ApiSection(Section):
    """The proactive message HTTP API."""

    rate_limit_per_minute: int = Field(60, ge=1, le=1_000_000, description="Requests per minute per API token.")
    max_text_length: int = Field(1024, ge=1, le=100_000, description="Longest text a proactive message may carry.")
    max_image_bytes: int = Field(
        1_500_000,
        ge=1,
        le=1_800_000,
        description=(
            "Largest base64 image a proactive message may carry (decoded bytes). Capped below the "
            "2.5 MB request body limit, which base64 (4/3 of the size) must fit in."
        ),
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
        description="Unique short name; its tools are offered to the model as <name>__<tool>.",
    )
    enabled: bool = Field(True, description="false: not started; its tools are not offered.")
    command: str | None = Field(
        None, min_length=1, max_length=1024, description="stdio transport: the program to start (give this or url)."
    )
    args: list[Annotated[str, Field(max_length=1024)]] = Field(
        default_factory=list, max_length=64, description="stdio transport: the program's arguments."
    )
    env: dict[_ENV_NAME, Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=dict,
        max_length=64,
        description=(
            "stdio transport: extra environment variables. A value ${NAME} is read from this process's "
            "environment, for a NAME the deployment lists in MAIBOT_MCP_SECRET_ENVS (keep secrets out of this file)."
        ),
    )
    url: str | None = Field(
        None,
        max_length=2048,
        pattern=r"^https?://",
        description="Streamable-HTTP transport: the server's endpoint URL (give this or command).",
    )
    headers: dict[Annotated[str, Field(min_length=1, max_length=128)], Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=dict,
        max_length=64,
        description="Streamable-HTTP transport: extra request headers (a value ${NAME}: as in env).",
    )
    tools: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(
        default_factory=lambda: ["*"],
        max_length=200,
        description='The server\'s tools the model is offered (its own names); ["*"]: all of them.',
    )
    scopes: list[Annotated[str, Field(pattern=r"^(chat|life)$")]] = Field(
        default_factory=lambda: ["chat"],
        max_length=2,
        description=(
            "Where its tools are offered: chat (the chat planner, connected by the server process), life "
            "(the life loop, connected by each cluster worker on its first turn)."
        ),
    )
    call_timeout_seconds: float = Field(
        30.0, ge=0.5, le=600, description="How long one tool call may take before it fails with tool_timeout."
    )
    connect_timeout_seconds: float = Field(
        20.0, ge=1, le=300, description="How long starting or connecting to the server may take."
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


class McpSection(Section):
    """MCP servers whose tools join the bot's planner (the bot's own MCP endpoint is /mcp)."""

    servers: list[McpServerEntry] = Field(
        default_factory=list,
        max_length=32,
        description="MCP servers ([[mcp.servers]]: name, command with args and env or url with headers, tools, "
        "scopes, call_timeout_seconds, connect_timeout_seconds, enabled), edited in the TOML editor.",
        json_schema_extra=RAW_ONLY,
    )

    @field_validator("servers")
    @classmethod
    def _unique_names(cls, servers: list[McpServerEntry]) -> list[McpServerEntry]:
        names = [s.name for s in servers]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"server names must be unique; repeated: {', '.join(duplicates)}")
        return servers


class PluginLimitsEntry(Section):
    """One plugin's own limits ([[plugins.limits]]); a key left out keeps the [plugins] value."""

    plugin: str = Field(min_length=1, max_length=200, description="The plugin's id (its manifest's id).")
    network: str | None = Field(None, max_length=16, pattern=r"^(isolated|none)$", description="As plugins.network.")
    runner_memory_mb: int | None = Field(None, ge=0, le=65_536, description="As plugins.runner_memory_mb.")
    runner_cpu_seconds_per_minute: float | None = Field(
        None, ge=1, le=3600, description="As plugins.runner_cpu_seconds_per_minute."
    )
    runner_max_processes: int | None = Field(None, ge=8, le=4096, description="As plugins.runner_max_processes.")
    runner_max_open_files: int | None = Field(None, ge=32, le=65_536, description="As plugins.runner_max_open_files.")
    runner_max_file_mb: int | None = Field(None, ge=1, le=65_536, description="As plugins.runner_max_file_mb.")
    sends_per_minute: int | None = Field(None, ge=1, le=100_000, description="As plugins.sends_per_minute.")
    media_mb_per_minute: int | None = Field(None, ge=1, le=100_000, description="As plugins.media_mb_per_minute.")


class PluginsSection(Section):
    """MaiBot SDK plugins ($MAIBOT_DATA_DIR/plugins/): their runner subprocesses, hot reload, dependencies."""

    load_timeout: float = Field(
        30.0, gt=0, le=600, description="A plugin's runner must start and finish on_load within this (seconds)."
    )
    cancel_grace: float = Field(
        2.0,
        gt=0,
        le=60,
        description="A runner must confirm a cancelled call (timed out) within this, or it is stuck and restarted "
        "(seconds).",
    )
    restart_backoff_seconds: float = Field(
        1.0, gt=0, le=600, description="Wait before restarting a crashed runner; doubles on each crash (seconds)."
    )
    restart_backoff_max_seconds: float = Field(
        60.0, gt=0, le=3600, description="The longest wait before restarting a crashed runner (seconds)."
    )
    max_restarts: int = Field(
        5,
        ge=0,
        le=100,
        description="Crashes within restart_window_seconds after which a plugin is left failed (reload to retry).",
    )
    restart_window_seconds: float = Field(
        600.0, ge=1, le=86_400, description="The window max_restarts counts crashes in (seconds)."
    )
    runner_memory_mb: int = Field(
        2048,
        ge=0,
        le=65_536,
        description="Address-space limit of each plugin runner (MB; 0: none). A plugin over it gets MemoryError.",
    )
    network: str = Field(
        "isolated",
        max_length=16,
        pattern=r"^(isolated|none)$",
        description="A runner's network: isolated (the internet through slirp4netns, never this machine's "
        "loopback services; no network when slirp4netns is not installed) or none. A plugin the deployment "
        "lists in MAIBOT_PLUGIN_HOST_NETWORK gets this machine's network instead.",
    )
    runner_cpu_seconds_per_minute: float = Field(
        30.0,
        ge=1,
        le=3600,
        description="CPU time a runner (all its processes) may use in any minute (seconds); past it the runner "
        "is killed and restarted like a crashed one.",
    )
    runner_max_processes: int = Field(
        128, ge=8, le=4096, description="Processes and threads a runner may have at once (RLIMIT_NPROC)."
    )
    runner_max_open_files: int = Field(256, ge=32, le=65_536, description="Files a runner may have open at once.")
    runner_max_file_mb: int = Field(
        256,
        ge=1,
        le=65_536,
        description="The largest file a runner may write (MB), and the size of its private /tmp.",
    )
    sends_per_minute: int = Field(
        60,
        ge=1,
        le=100_000,
        description="Messages a plugin may send (send.*) in any minute; past it a send fails with the reason.",
    )
    media_mb_per_minute: int = Field(
        50,
        ge=1,
        le=100_000,
        description="Image, emoji and voice bytes a plugin may send, and PNG bytes it may render, in any minute (MB).",
    )
    limits: list[PluginLimitsEntry] = Field(
        default_factory=list,
        max_length=500,
        description="Per-plugin limits ([[plugins.limits]]: plugin = its id, then any of network, "
        "runner_memory_mb, runner_cpu_seconds_per_minute, runner_max_processes, runner_max_open_files, "
        "runner_max_file_mb, sends_per_minute, media_mb_per_minute), edited in the TOML editor.",
        json_schema_extra=RAW_ONLY,
    )
    hot_reload: bool = Field(
        True,
        description="Reload a plugin when one of its files or its config.toml changes, and load a plugin folder "
        "put in while running (a removed folder always unloads its plugin).",
        json_schema_extra={"requires_restart": True},
    )
    reload_debounce_ms: int = Field(
        500,
        ge=10,
        le=10_000,
        description="Plugin file changes are applied once the folder has been quiet this long (milliseconds).",
        json_schema_extra={"requires_restart": True},
    )
    install_timeout: float = Field(
        300.0, gt=0, le=3600, description="One dependency installation may take this long (seconds)."
    )

    @field_validator("limits")
    @classmethod
    def _one_entry_per_plugin(cls, entries: list[PluginLimitsEntry]) -> list[PluginLimitsEntry]:
        ids = [e.plugin for e in entries]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise ValueError(f"one [[plugins.limits]] entry per plugin; repeated: {', '.join(duplicates)}")
        return entries


class LifeSection(Section):
    """The life loop (timers, inner state) and the model's memory (slots, summaries, scratch notes)."""

    turn_timeout: float = Field(120.0, gt=0, le=3600, description="Hard timeout of one life-loop turn (seconds).")
    max_timers_per_session: int = Field(
        20, ge=1, le=10_000, description="Active timers one chat may have (set_timer refuses more)."
    )
    max_payload_length: int = Field(2000, ge=1, le=100_000, description="Longest timer payload (characters).")
    firing_requeue_seconds: float = Field(
        300.0,
        gt=0,
        le=86_400,
        description="A timer firing no worker has started after this long is handed to the task queue again.",
    )
    inner_state_max_length: int = Field(
        4000, ge=1, le=100_000, description="Longest inner state text the model or an operator may write."
    )
    memory_max_slots: int = Field(
        100, ge=1, le=10_000, description="Memory slots per scope: global, and each chat, may hold this many facts."
    )
    memory_max_content_length: int = Field(300, ge=1, le=10_000, description="Longest memory slot content.")
    summary_every_messages: int = Field(
        50,
        ge=0,
        le=100_000,
        description="Refresh a chat's rolling summary after this many new messages (0: never summarize).",
    )
    summary_max_messages: int = Field(
        200, ge=1, le=5000, description="At most this many new messages are read by one summary refresh."
    )
    scratch_notes_shown: int = Field(10, ge=0, le=200, description="The latest scratch notes shown to the planner.")


class ConsoleSection(Section):
    """The operator console: config hot reload, live logs, health checks."""

    reload_debounce_ms: int = Field(
        300,
        ge=10,
        le=10_000,
        description="Config file changes are applied once the file has been quiet this long (milliseconds).",
        json_schema_extra={"requires_restart": True},  # the file watcher reads it when it starts
    )
    log_level: str = Field(
        "INFO",
        max_length=8,
        pattern=r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL)$",
        description="Lowest level of log records kept for the live log page (DEBUG, INFO, WARNING, ERROR).",
    )
    log_retention_rows: int = Field(
        20_000, ge=100, le=10_000_000, description="Log lines kept for the live log page; older ones are deleted."
    )
    log_retention_days: int = Field(7, ge=1, le=365, description="Log lines older than this many days are deleted.")
    heartbeat_seconds: float = Field(
        2.0,
        gt=0,
        le=300,
        description="How often each server and cluster process writes its heartbeat (seconds). A process silent "
        "for 4 times this counts as dead: the others take back the messages it had claimed and send them.",
    )
    cluster_stale_seconds: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="/healthz reports the cluster down when its last heartbeat is older than this (seconds).",
    )
    health_requires_adapter: bool = Field(
        False, description="/healthz reports unhealthy (503) while no platform adapter is connected."
    )


@dataclass(frozen=True)
class LLMModel:
    """A model as calls use it: its provider settings resolved (environment overrides, key read)."""

    name: str
    base_url: str | None
    api_key: str = dataclass_field(repr=False)
    model: str
    price_input_per_1m: float
    price_output_per_1m: float
    timeout: float
    max_concurrent: int  # 0: no limit


class BotConfig(Section):
    bot: BotSection = Field(default_factory=BotSection)
    llm: LLMSection = Field(default_factory=LLMSection)
    chat: ChatSection = Field(default_factory=ChatSection)
    scheduling: SchedulingSection = Field(default_factory=SchedulingSection)
    gateway: GatewaySection = Field(default_factory=GatewaySection)
    api: ApiSection = Field(default_factory=ApiSection)
    life: LifeSection = Field(default_factory=LifeSection)
    console: ConsoleSection = Field(default_factory=ConsoleSection)
    mcp: McpSection = Field(default_factory=McpSection)
    plugins: PluginsSection = Field(default_factory=PluginsSection)

    # --- derived values, read through the config so callers never look at os.environ ----------
    @property
    def tzinfo(self) -> ZoneInfo:
        from django.conf import settings

        return ZoneInfo(self.bot.time_zone or settings.TIME_ZONE)

    @property
    def llm_model(self) -> str:
        return os.environ.get("MAIBOT_LLM_MODEL") or self.llm.model

    @property
    def llm_base_url(self) -> str | None:
        return os.environ.get("OPENAI_BASE_URL") or self.llm.base_url or None

    @property
    def llm_api_key(self) -> str:
        return os.environ.get(self.llm.api_key_env) or os.environ.get("OPENAI_API_KEY") or "not-needed"

    @property
    def offline(self) -> bool:
        """No model configured: the clearly labelled offline planner answers instead."""
        return not self.llm_models()

    def llm_models(self) -> dict[str, LLMModel]:
        """The models calls may go to, by name: "default" (the single model of [llm], when set) and
        [[llm.models]]."""
        models: dict[str, LLMModel] = {}
        llm = self.llm
        if self.llm_model:
            models[DEFAULT_MODEL] = LLMModel(
                name=DEFAULT_MODEL,
                base_url=self.llm_base_url,
                api_key=self.llm_api_key,
                model=self.llm_model,
                price_input_per_1m=llm.price_input_per_1m,
                price_output_per_1m=llm.price_output_per_1m,
                timeout=llm.timeout,
                max_concurrent=0,
            )
        for m in llm.models:
            models[m.name] = LLMModel(
                name=m.name,
                base_url=m.base_url or self.llm_base_url,
                # Never another provider's key: only the variable this model names.
                api_key=os.environ.get(m.api_key_env) or "not-needed",
                model=m.model,
                price_input_per_1m=m.price_input_per_1m,
                price_output_per_1m=m.price_output_per_1m,
                timeout=m.timeout,
                max_concurrent=m.max_concurrent,
            )
        return models

    def llm_route(self, task: str) -> list[LLMModel]:
        """The models a task's calls try, in order (empty: offline). `task` outside LLM_TASKS is utility."""
        models = self.llm_models()
        task = task if task in LLM_TASKS else "utility"
        names = self.llm.tasks.get(task)
        if names is None:
            names = [DEFAULT_MODEL] if DEFAULT_MODEL in models else [m.name for m in self.llm.models[:1]]
        return [models[n] for n in names if n in models]


# --- loading --------------------------------------------------------------------------------------


def _format_errors(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(file)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        lines.append(f"{key}: {msg}")
    return "; ".join(lines)


# Keys of earlier versions that are no longer bot config (whoever may edit the config must not choose
# what pip installs or from where): a file that still has them loads, they are ignored and a warning
# says where the setting went, rather than the file failing as "unknown key".
RETIRED_KEYS = {
    ("plugins", "pip_args"): "the package index is a deployment setting now: MAIBOT_PIP_INDEX_URL, "
    "MAIBOT_PIP_EXTRA_INDEX_URL",
    ("plugins", "auto_install_dependencies"): "automatic installs are a deployment setting now: "
    "MAIBOT_PLUGIN_AUTO_INSTALL=1",
}
_warned_retired: set[tuple[str, str]] = set()


def retired_keys(data: dict[str, Any]) -> list[str]:
    """What the parsed file `data` still holds of RETIRED_KEYS, each as a sentence saying where it went."""
    return [
        f"{section}.{key} is no longer a bot config setting and is ignored ({where})"
        for (section, key), where in RETIRED_KEYS.items()
        if isinstance(data.get(section), dict) and key in data[section]
    ]


def _without_retired(data: dict[str, Any]) -> dict[str, Any]:
    for section, key in RETIRED_KEYS:
        if isinstance(data.get(section), dict) and key in data[section]:
            if (section, key) not in _warned_retired:  # once per process, not at every reload
                _warned_retired.add((section, key))
                logger.warning("bot_config.toml: %s", retired_keys({section: {key: None}})[0])
            data[section] = {k: v for k, v in data[section].items() if k != key}
    return data


def parse_config(text: str, source: str = "bot_config.toml") -> BotConfig:
    """Parse and validate TOML text. Raises ConfigError naming the key and the problem."""
    try:
        data = tomlkit.parse(text).unwrap()
    except Exception as exc:  # tomlkit raises several ParseError subclasses
        raise ConfigError(f"{source}: not valid TOML: {exc}") from exc
    data = _without_retired(data)
    try:
        return BotConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_format_errors(exc)}") from exc


def config_path() -> Path:
    from django.conf import settings

    return Path(settings.DATA_DIR) / "bot_config.toml"


def ensure_config_file(path: Path | None = None) -> Path:
    """Create the live config from the template on first run; never overwrite an existing one."""
    path = path or config_path()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        text = TEMPLATE_PATH.read_text(encoding="utf-8") if TEMPLATE_PATH.exists() else render_template()
        # Write aside, then link into place: the file appears whole or not at all, and a
        # concurrent first start never overwrites what another process created.
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.unlink(missing_ok=True)  # a leftover of a crashed start with the same pid
        private_write(tmp, text)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    return path


def private_write(path: Path, text: str) -> None:
    """Write `text` to a new file `path`, mode 0600 whatever the umask (the data dir is private)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)


def load_config(path: Path | None = None) -> BotConfig:
    path = ensure_config_file(path)
    return parse_config(path.read_text(encoding="utf-8"), source=str(path))


_lock = threading.RLock()
_current: BotConfig | None = None


def get_config() -> BotConfig:
    """The bot configuration in force. Loaded on first use; swapped atomically on reload."""
    global _current
    cfg = _current
    if cfg is None:
        with _lock:
            if _current is None:
                _current = load_config()
            cfg = _current
    return cfg


def set_config(cfg: BotConfig) -> None:
    global _current
    with _lock:
        _current = cfg


def reload_config() -> BotConfig:
    """Re-read the file; on error the old config stays in force and ConfigError is raised."""
    cfg = load_config()
    set_config(cfg)
    return cfg


@contextlib.contextmanager
def override(**sections: dict[str, Any]) -> Iterator[BotConfig]:
    """Temporarily replace config values in this process: override(scheduling={"max_attempts": 2})."""
    old = get_config()
    data = old.model_dump()
    for name, values in sections.items():
        data[name] = {**data[name], **values}
    set_config(BotConfig.model_validate(data))
    try:
        yield get_config()
    finally:
        set_config(old)


# --- documentation (one source: the template comments and the console editor's help texts) ---------


def requires_restart(field: Any) -> bool:
    """A field marked `json_schema_extra={"requires_restart": True}` is read once at start-up, so a hot
    reload does not change it. Components read get_config() on each use, so only the watcher's own
    `console.reload_debounce_ms` needs this."""
    extra = field.json_schema_extra
    return bool(isinstance(extra, dict) and extra.get("requires_restart"))


def raw_only(field: Any) -> bool:
    """A field of tables (e.g. [[llm.models]]): written in the TOML editor, not the console's form."""
    extra = field.json_schema_extra
    return bool(isinstance(extra, dict) and extra.get("raw_only"))


def field_help(field: Any) -> str:
    """The help text of a config field, as the template comment and the editor show it."""
    text = field.description or ""
    if requires_restart(field):
        text = f"{text} (Takes effect after a restart.)".strip()
    return text


# --- template -------------------------------------------------------------------------------------


def render_template() -> str:
    """The commented bot_config.toml template, generated from the model's descriptions."""
    doc = tomlkit.document()
    doc.add(tomlkit.comment("maibot bot configuration. Generated from core/config.py: edit the"))
    doc.add(tomlkit.comment("descriptions there, then run `python manage.py write_config_template`."))
    defaults = BotConfig()
    for name, field in BotConfig.model_fields.items():
        section_model = field.annotation
        table = tomlkit.table()
        if section_model.__doc__:
            table.add(tomlkit.comment(section_model.__doc__.strip()))
        section_value = getattr(defaults, name)
        for key, sub in section_model.model_fields.items():
            if raw_only(sub):
                # Tables of their own ([[llm.models]], ...): documented here, absent until written.
                table.add(tomlkit.comment(f"{key}: {field_help(sub)} None by default; see README."))
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


def format_instant(value: datetime, tz: tzinfo) -> str:
    """An instant as ISO 8601 with the offset of `tz`, to the second (how every time is shown)."""
    return value.astimezone(tz).isoformat(timespec="seconds")
