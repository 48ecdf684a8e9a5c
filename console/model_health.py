"""Which configured models are failing now, for the console's banner: a model whose latest call (the bot's
own, not an operator's test) failed, with that failure and since when (its first failure after its
last success). Read from the LLM ledger, so every process's calls count."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.utils import timezone

from chat.models import LLMCall
from core.config import get_config

# Calls older than this say nothing about now.
LOOKBACK = timedelta(days=7)


@dataclass(frozen=True)
class FailingModel:
    name: str  # the configured name ("default", or an [[llm.models]] entry's)
    model: str  # the provider's model id
    status: str  # the latest failure: its kind and the provider's short message ("HTTP 401: Incorrect API key")
    since: datetime  # the first failure after the last success
    failures: int  # failed calls since then


def failing_models(now: datetime | None = None) -> list[FailingModel]:
    """The configured models whose latest call failed, in the config's order (a few queries per model)."""
    now = now or timezone.now()
    calls = LLMCall.objects.filter(created_at__gte=now - LOOKBACK).exclude(purpose="model_test")
    failing = []
    for name in get_config().llm_models():
        mine = calls.filter(model_name=name)
        latest = mine.order_by("-created_at", "-id").first()
        if latest is None or not latest.error:
            continue
        last_ok = mine.filter(error="").order_by("-created_at").values_list("created_at", flat=True).first()
        streak = mine.exclude(error="")
        if last_ok is not None:
            streak = streak.filter(created_at__gt=last_ok)
        first = streak.order_by("created_at").values_list("created_at", flat=True).first()
        failing.append(
            FailingModel(name=name, model=latest.model, status=latest.error, since=first, failures=streak.count())
        )
    return failing
