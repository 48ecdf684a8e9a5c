"""The whole bot configuration (`BotConfig`, one field per section) and a resolved model route."""

from __future__ import annotations

import os
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from zoneinfo import ZoneInfo

from django.utils.translation import gettext_noop
from pydantic import Field

from core.config.base import Section
from core.config.entries import DEFAULT_MODEL, LLM_TASKS
from core.config.operations import ConsoleSection, LifeSection, SchedulingSection
from core.config.sections import BotSection, ChatSection, LLMSection
from core.config.services import ApiSection, GatewaySection, McpSection, PluginsSection


def _refresh_secrets() -> None:
    """The keys as deployment.env holds them now (a key changed in the console applies from the next call)."""
    from django.conf import settings

    if settings.configured:
        from core import deployment_env

        deployment_env.refresh()


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
    bot: BotSection = Field(default_factory=BotSection, title=gettext_noop("Bot"))
    llm: LLMSection = Field(default_factory=LLMSection, title=gettext_noop("Models and budgets"))
    chat: ChatSection = Field(default_factory=ChatSection, title=gettext_noop("Chat"))
    scheduling: SchedulingSection = Field(default_factory=SchedulingSection, title=gettext_noop("Scheduled messages"))
    gateway: GatewaySection = Field(default_factory=GatewaySection, title=gettext_noop("Adapters and delivery"))
    api: ApiSection = Field(default_factory=ApiSection, title=gettext_noop("Proactive message API"))
    life: LifeSection = Field(default_factory=LifeSection, title=gettext_noop("Life loop and memory"))
    console: ConsoleSection = Field(default_factory=ConsoleSection, title=gettext_noop("Console"))
    mcp: McpSection = Field(default_factory=McpSection, title=gettext_noop("MCP servers"))
    plugins: PluginsSection = Field(default_factory=PluginsSection, title=gettext_noop("Plugins"))

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
        _refresh_secrets()
        return os.environ.get(self.llm.api_key_env) or os.environ.get("OPENAI_API_KEY") or "not-needed"

    @property
    def offline(self) -> bool:
        """No model configured: the clearly labelled offline planner answers instead."""
        return not self.llm_models()

    def llm_models(self) -> dict[str, LLMModel]:
        """The models calls may go to, by name: "default" (the single model of [llm], when set) and
        [[llm.models]]."""
        _refresh_secrets()
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
