"""The bot's identity, its models and budgets and how it chats: the first of bot_config.toml's sections (one
pydantic model each; a field's description is its documentation, its title the console's label)."""

from __future__ import annotations

from typing import Annotated
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.utils.translation import gettext_noop
from pydantic import Field, field_validator, model_validator

from core.config.base import Section
from core.config.entries import (
    DEFAULT_MODEL,
    LLM_TASKS,
    Budget,
    LLMTask,
    ModelEntry,
    ModelName,
    TalkRule,
    _check_key_variable,
)


def known_zone(value: str) -> str:
    """`value` if it is empty or an IANA time zone this machine knows; else ValueError naming it."""
    if value:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown time zone {value!r}") from exc
    return value


class BotSection(Section):
    __doc__ = gettext_noop("""Who the bot is.""")

    nickname: str = Field(
        "麦麦",
        min_length=1,
        max_length=64,
        title=gettext_noop("Nickname"),
        description=gettext_noop("The bot's name in chats."),
    )
    alias_names: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        default_factory=lambda: ["MaiBot", "麦麦"],
        max_length=50,
        title=gettext_noop("Other names"),
        description=gettext_noop("Other names that count as mentioning the bot in a group chat."),
    )
    platform_accounts: dict[
        Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")],
        Annotated[str, Field(min_length=1, max_length=128)],
    ] = Field(
        default_factory=dict,
        max_length=50,
        title=gettext_noop("Bot accounts per platform"),
        description=gettext_noop(
            'The bot\'s own account id on each platform, e.g. {qq = "123456"}: `@<any name:that id>` is a '
            "mention, and group messages are sent as that account. Unset: what the adapter tells, if it does."
        ),
    )
    language: str = Field(
        "zh",
        max_length=16,
        pattern=r"^[a-z]{2}(-[A-Za-z]{2,4})?$",
        title=gettext_noop("Language"),
        description=gettext_noop("The language the bot speaks (BCP 47, e.g. zh or en). Fixed texts follow it."),
    )
    persona: str = Field(
        "你是麦麦，一个友善、简洁、有点俏皮的大学生。说话口语化，不长篇大论。",
        min_length=1,
        max_length=8000,
        title=gettext_noop("Persona"),
        description=gettext_noop("The persona given to the model at the top of every prompt."),
    )
    time_zone: str = Field(
        "",
        max_length=64,
        title=gettext_noop("Time zone"),
        description=gettext_noop(
            "IANA time zone the bot lives in (times without an offset are read in it). "
            "Empty: the MAIBOT_TIME_ZONE environment setting."
        ),
    )

    @field_validator("time_zone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        return known_zone(value)


# Fields of tables of their own ([[llm.models]], [llm.tasks], ...): the config template documents them in a
# comment, absent from the file until written (the console's form edits them as tables).
TABLE = {"table": True}


class LLMSection(Section):
    __doc__ = gettext_noop(
        """The OpenAI-compatible models the planner, the life loop and summaries call, and their budgets.

    The single model of this section (base_url, model, ...) is named "default". More models go in
    [[llm.models]]; [llm.tasks] routes each task to an ordered list of them (the first that answers
    wins); [[llm.budgets]] caps daily spend. See docs/bot.md, "Cost control".
    """
    )

    base_url: str = Field(
        "",
        max_length=2048,
        title=gettext_noop("API base URL"),
        description=gettext_noop("API base URL, e.g. https://api.openai.com/v1 (OPENAI_BASE_URL overrides)."),
    )
    model: str = Field(
        "",
        max_length=256,
        title=gettext_noop("Model"),
        description=gettext_noop("Model name. Empty: offline mode (MAIBOT_LLM_MODEL overrides)."),
    )
    api_key_env: str = Field(
        "OPENAI_API_KEY",
        min_length=1,
        max_length=128,
        title=gettext_noop("API key variable"),
        description=gettext_noop(
            "Name of the environment variable holding the API key: OPENAI_API_KEY, or one the deployment "
            "allows in MAIBOT_LLM_KEY_ENVS (comma-separated)."
        ),
    )
    timeout: float = Field(
        120.0,
        gt=0,
        le=3600,
        title=gettext_noop("Call timeout (seconds)"),
        description=gettext_noop("Seconds before one LLM call times out."),
    )
    max_retries: int = Field(
        2,
        ge=0,
        le=10,
        title=gettext_noop("Retries"),
        description=gettext_noop("Retries the SDK makes on connection errors and 5xx."),
    )
    temperature: float = Field(
        0.7, ge=0, le=2, title=gettext_noop("Temperature"), description=gettext_noop("Sampling temperature.")
    )
    price_input_per_1m: float = Field(
        0.0,
        ge=0,
        le=10_000,
        title=gettext_noop("Price per 1M prompt tokens"),
        description=gettext_noop("Price per 1M prompt tokens (for the cost ledger)."),
    )
    price_output_per_1m: float = Field(
        0.0,
        ge=0,
        le=10_000,
        title=gettext_noop("Price per 1M completion tokens"),
        description=gettext_noop("Price per 1M completion tokens (for the cost ledger)."),
    )

    models: list[ModelEntry] = Field(
        default_factory=list,
        max_length=20,
        title=gettext_noop("More models"),
        description=gettext_noop(
            "More models ([[llm.models]]: name, base_url, api_key_env, model, prices, timeout, max_concurrent)."
        ),
        json_schema_extra=TABLE,
    )
    tasks: dict[LLMTask, list[ModelName]] = Field(
        default_factory=dict,
        max_length=len(LLM_TASKS),
        title=gettext_noop("Task routes"),
        description=gettext_noop(
            "Each task (planner, life, summary, utility) to an ordered list of model names: a provider "
            'error or timeout tries the next. Unlisted tasks use "default" (this section\'s model), else the '
            "first of [[llm.models]]."
        ),
        json_schema_extra=TABLE,
    )
    embedding: list[ModelName] = Field(
        default_factory=list,
        max_length=20,
        title=gettext_noop("Embedding models"),
        description=gettext_noop(
            "Embedding models (plugins' llm.embed): an ordered list of model names, each an "
            "OpenAI-compatible /embeddings model; a provider error tries the next. Empty: llm.embed answers "
            "that none is configured."
        ),
        json_schema_extra=TABLE,
    )
    voice: list[ModelName] = Field(
        default_factory=list,
        max_length=20,
        title=gettext_noop("Speech-to-text models"),
        description=gettext_noop(
            "Speech-to-text models (plugins' llm.transcribe_audio): an ordered list of model names, each an "
            "OpenAI-compatible /audio/transcriptions model. Empty: llm.transcribe_audio answers that none is "
            "configured."
        ),
        json_schema_extra=TABLE,
    )
    budgets: list[Budget] = Field(
        default_factory=list,
        max_length=100,
        title=gettext_noop("Daily budgets"),
        description=gettext_noop(
            "Daily caps ([[llm.budgets]]: scope model | task | session, target, daily_tokens, daily_cost). "
            "A call that would run past one is not made. None by default."
        ),
        json_schema_extra=TABLE,
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
        for route in ("embedding", "voice"):
            if unknown := [n for n in getattr(self, route) if n not in known]:
                raise ValueError(f"llm.{route} names unknown model(s): {', '.join(unknown)}")
        for budget in self.budgets:
            if budget.scope == "model" and budget.target not in known:
                raise ValueError(f"a budget names the unknown model {budget.target!r}")
        return self


class ChatSection(Section):
    __doc__ = gettext_noop("""The per-session planner loop.""")

    debounce_seconds: float = Field(
        1.0,
        ge=0,
        le=60,
        title=gettext_noop("Message burst wait (seconds)"),
        description=gettext_noop("Wait this long after a message so a burst becomes one cycle."),
    )
    max_rounds: int = Field(
        5,
        ge=1,
        le=20,
        title=gettext_noop("Tool rounds per cycle"),
        description=gettext_noop("Tool-call rounds per cycle before it must end."),
    )
    no_reply_timeout: float = Field(
        300.0,
        gt=0,
        le=86_400,
        title=gettext_noop("Private chat follow-up wait (seconds)"),
        description=gettext_noop(
            "Private chats: after no_reply, seconds before the planner looks once more without a new message."
        ),
    )
    history_window: int = Field(
        30,
        ge=1,
        le=500,
        title=gettext_noop("Recent messages shown"),
        description=gettext_noop("Recent messages shown to the planner."),
    )
    cycle_records: int = Field(
        5,
        ge=0,
        le=50,
        title=gettext_noop("Previous cycles shown"),
        description=gettext_noop("Previous cycle records shown to the planner."),
    )
    model_failure_reply: str = Field(
        "抱歉，我现在脑子转不动了，过一会儿再来找我吧。",
        max_length=500,
        title=gettext_noop("Reply when the model fails"),
        description=gettext_noop(
            "Private chats: what the user is told when the model cannot answer (a wrong key, the provider "
            "down), instead of silence. Empty: say nothing."
        ),
    )
    model_failure_reply_interval: float = Field(
        600.0,
        ge=0,
        le=86_400,
        title=gettext_noop("Model failure reply interval (seconds)"),
        description=gettext_noop("Seconds after telling a chat that the model failed before telling it again."),
    )
    talk_frequency: float = Field(
        0.5,
        ge=0,
        le=1,
        title=gettext_noop("Group talk frequency"),
        description=gettext_noop(
            "Group chats: how readily the bot speaks unprompted (0 only when mentioned, 1 freely)."
        ),
    )
    talk_frequency_rules: list[TalkRule] = Field(
        default_factory=list,
        max_length=200,
        title=gettext_noop("Talk frequency rules"),
        description=gettext_noop(
            "[[chat.talk_frequency_rules]]: chat (empty: every chat), start and end (HH:MM, local; "
            "equal: all day), talk_frequency. A rule for the chat beats one for every chat; then the first listed."
        ),
        json_schema_extra=TABLE,
    )
    ignored_chats: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        default_factory=list,
        max_length=10_000,
        title=gettext_noop("Ignored chats"),
        description=gettext_noop(
            "Chats whose messages are stored but never planned: platform:group:ID or platform:private:ID."
        ),
    )
    ignored_users: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        default_factory=list,
        max_length=10_000,
        title=gettext_noop("Ignored users"),
        description=gettext_noop("People whose messages are stored but never planned, anywhere: platform:USER_ID."),
    )
    command_operators: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        default_factory=list,
        max_length=1000,
        title=gettext_noop("Command operators"),
        description=gettext_noop(
            "If set, only these accounts (platform:USER_ID) may use commands (/list, /cancel, reminders, "
            "plugin commands); others' commands are not run nor planned. Empty: everyone."
        ),
    )
    max_runtimes: int = Field(
        10_000,
        ge=1,
        le=100_000,
        title=gettext_noop("Live session loops at most"),
        description=gettext_noop(
            "At most this many session loops live at once (an idle one costs ~6-10 KB and no CPU)."
        ),
    )
    idle_evict_seconds: float = Field(
        1800.0,
        gt=0,
        le=604_800,
        title=gettext_noop("Idle session stop (seconds)"),
        description=gettext_noop("A session loop idle this long is stopped (it restarts on the next message)."),
    )
    max_reply_length: int = Field(
        2000,
        ge=1,
        le=100_000,
        title=gettext_noop("Longest reply (characters)"),
        description=gettext_noop(
            "Longest chat message the model may send (longer is rambling or a data dump: refused)."
        ),
    )
    tool_timeout: float = Field(
        30.0,
        gt=0,
        le=3600,
        title=gettext_noop("Tool timeout (seconds)"),
        description=gettext_noop(
            "Seconds one tool call may run before the model is told it timed out; also the longest a "
            "plugin's hook or event handler may take (one may ask for less)."
        ),
    )
