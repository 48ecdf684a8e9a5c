"""Daily LLM budgets (`[[llm.budgets]]`): which caps a call falls under, admitting it against their
counters (LLMSpend rows, one per cap and local day), charging what it spent, and telling the operators
when a cap is reached.

A call is admitted by one conditional UPDATE per cap (`… WHERE tokens < cap AND cost < cap`), so every
server and cluster process sees the same counters: once a cap is reached no process starts another
call under it. Calls already in flight when it is reached still finish and are charged, so a cap is
overspent by at most the calls in flight at that moment (one per process for sequential callers).

Days run from local midnight in the bot's time zone. `clock` is the one source of "now" here (tests
inject theirs).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

from django.db import IntegrityError, transaction
from django.db.models import F, Q, Sum
from django.utils import timezone

from chat.models import LLMCall, LLMSpend
from core.config import LLM_TASKS, BotConfig, Budget, format_instant, get_config

logger = logging.getLogger(__name__)

clock: Callable[[], datetime] = timezone.now


def task_of(purpose: str) -> str:
    """The task a call's purpose belongs to (anything not planner, life or summary is utility)."""
    return purpose if purpose in LLM_TASKS else "utility"


def local_day(now: datetime, tz: ZoneInfo) -> date:
    return now.astimezone(tz).date()


def day_start(day: date, tz: ZoneInfo) -> datetime:
    return datetime.combine(day, time(0), tzinfo=tz)


def resets_at(day: date, tz: ZoneInfo) -> datetime:
    """The next local midnight after `day` began: when its counters stop applying."""
    return day_start(day + timedelta(days=1), tz)


@dataclass(frozen=True)
class Cap:
    """One configured budget as it applies to one call: its counter's key and its limits."""

    scope: str
    target: str  # counter key: model name, task name, or the session's pk
    daily_tokens: int
    daily_cost: float

    @property
    def label(self) -> str:
        what = {"model": "model", "task": "task", "session": "chat"}[self.scope]
        return f"{what} {self.target}"

    def limits(self) -> str:
        parts = []
        if self.daily_tokens:
            parts.append(f"{self.daily_tokens:,} tokens")
        if self.daily_cost:
            parts.append(f"{self.daily_cost:g} cost")
        return " / ".join(parts)

    def reached(self, tokens: int, cost: Decimal) -> bool:
        return bool(
            (self.daily_tokens and tokens >= self.daily_tokens)
            or (self.daily_cost and cost >= Decimal(str(self.daily_cost)))
        )


def _cap(budget: Budget, target: str) -> Cap:
    return Cap(scope=budget.scope, target=target, daily_tokens=budget.daily_tokens, daily_cost=budget.daily_cost)


def caps_for(cfg: BotConfig, *, task: str, model: str | None = None, session_id: int | None = None) -> list[Cap]:
    """The caps a call of `task` (to `model`, for `session_id`) counts against. model=None: only the
    task's and the session's (the caps that stop a call whatever model it goes to)."""
    caps, model_caps = [], []
    for budget in cfg.llm.budgets:
        if budget.scope == "task" and budget.target == task:
            caps.append(_cap(budget, task))
        elif budget.scope == "session" and session_id is not None:
            caps.append(_cap(budget, str(session_id)))
        elif budget.scope == "model" and model is not None and budget.target == model:
            model_caps.append(_cap(budget, model))
    # The caps that stop every model first: a refusal then names the cap that really stops the call.
    return caps + model_caps


def _ledger_filter(cap: Cap) -> Q:
    if cap.scope == "model":
        return Q(model_name=cap.target)
    if cap.scope == "task":
        return Q(task=cap.target)
    return Q(session_id=int(cap.target))


def _counter(cap: Cap, day: date, tz: ZoneInfo) -> LLMSpend:
    """The cap's counter for `day`; a new one starts from what the ledger already holds for that day
    (a cap added mid-day counts the day's spend so far)."""
    row = LLMSpend.objects.filter(day=day, scope=cap.scope, target=cap.target).first()
    if row is not None:
        return row
    start = day_start(day, tz)
    spent = LLMCall.objects.filter(
        _ledger_filter(cap), created_at__gte=start, created_at__lt=resets_at(day, tz)
    ).aggregate(p=Sum("prompt_tokens"), c=Sum("completion_tokens"), cost=Sum("cost"))
    try:
        with transaction.atomic():
            return LLMSpend.objects.create(
                day=day,
                scope=cap.scope,
                target=cap.target,
                tokens=(spent["p"] or 0) + (spent["c"] or 0),
                cost=spent["cost"] or Decimal(0),
            )
    except IntegrityError:  # another process created it first
        return LLMSpend.objects.get(day=day, scope=cap.scope, target=cap.target)


@dataclass
class Admission:
    """The outcome of asking to make one call: admitted (with the day it counts on) or refused by `cap`."""

    day: date
    caps: list[Cap]
    refused_by: Cap | None = None
    resets: datetime | None = None

    @property
    def admitted(self) -> bool:
        return self.refused_by is None

    def reason(self, tz: ZoneInfo) -> str:
        cap = self.refused_by
        if cap is None:
            return ""
        return (
            f"daily budget reached: {cap.label} ({cap.limits()}); "
            f"resets at {format_instant(self.resets, tz) if self.resets else 'local midnight'}"
        )


def admit(*, caps: list[Cap], cfg: BotConfig | None = None) -> Admission:
    """Admit one call under `caps`, or refuse it naming the first cap already reached (and alert)."""
    cfg = cfg or get_config()
    tz = cfg.tzinfo
    day = local_day(clock(), tz)
    admission = Admission(day=day, caps=caps)
    for cap in caps:
        row = _counter(cap, day, tz)
        under = Q()
        if cap.daily_tokens:
            under &= Q(tokens__lt=cap.daily_tokens)
        if cap.daily_cost:
            under &= Q(cost__lt=Decimal(str(cap.daily_cost)))
        if not LLMSpend.objects.filter(under, pk=row.pk).update(calls=F("calls") + 1):
            LLMSpend.objects.filter(pk=row.pk).update(refused=F("refused") + 1)
            admission.refused_by = cap
            admission.resets = resets_at(day, tz)
            _alert(cap, row.pk, day, tz)
            return admission
    return admission


def charge(*, admission: Admission, tokens: int, cost: Decimal, cfg: BotConfig | None = None) -> None:
    """Add one finished call's spend to the counters it was admitted under (on the day it was admitted)."""
    if not admission.caps or not (tokens or cost):
        return
    tz = (cfg or get_config()).tzinfo
    for cap in admission.caps:
        LLMSpend.objects.filter(day=admission.day, scope=cap.scope, target=cap.target).update(
            tokens=F("tokens") + tokens, cost=F("cost") + cost
        )
        row = LLMSpend.objects.filter(day=admission.day, scope=cap.scope, target=cap.target).first()
        if row is not None and cap.reached(row.tokens, row.cost):
            _alert(cap, row.pk, admission.day, tz)


def _alert(cap: Cap, row_pk: int, day: date, tz: ZoneInfo) -> None:
    """Tell the operators once per cap and day (log; the console's banner reads the counters)."""
    if LLMSpend.objects.filter(pk=row_pk, alerted_at__isnull=True).update(alerted_at=timezone.now()):
        logger.warning(
            "LLM daily budget reached: %s (%s); calls under it wait until %s",
            cap.label,
            cap.limits(),
            format_instant(resets_at(day, tz), tz),
        )


def blocked(*, task: str, session_id: int | None = None, cfg: BotConfig | None = None) -> str:
    """Why a call of `task` would not be made now ("" when it would): a task or session cap is reached,
    or every model of the task's route is at its cap. Reads only (nothing is admitted)."""
    cfg = cfg or get_config()
    tz = cfg.tzinfo
    day = local_day(clock(), tz)

    def reached(cap: Cap) -> bool:
        row = LLMSpend.objects.filter(day=day, scope=cap.scope, target=cap.target).first()
        if row is None:
            row = _counter(cap, day, tz)
        return cap.reached(row.tokens, row.cost)

    for cap in caps_for(cfg, task=task, session_id=session_id):
        if reached(cap):
            return Admission(day=day, caps=[], refused_by=cap, resets=resets_at(day, tz)).reason(tz)
    route = cfg.llm_route(task)
    model_caps = [caps_for(cfg, task="-", model=m.name) for m in route]
    if route and all(any(reached(c) for c in caps) for caps in model_caps):
        cap = next(c for c in model_caps[-1] if reached(c))
        return Admission(day=day, caps=[], refused_by=cap, resets=resets_at(day, tz)).reason(tz)
    return ""


@dataclass
class BudgetState:
    """One configured cap's use today, for the dashboard and the banner."""

    cap: Cap
    tokens: int
    cost: Decimal
    reached: bool
    resets: datetime


def budget_states(cfg: BotConfig | None = None, *, only_reached: bool = False) -> list[BudgetState]:
    """Today's counters of the configured caps (session caps: the chats that have a counter today)."""
    cfg = cfg or get_config()
    tz = cfg.tzinfo
    day = local_day(clock(), tz)
    rows = {(r.scope, r.target): r for r in LLMSpend.objects.filter(day=day)}
    states = []
    for budget in cfg.llm.budgets:
        if budget.scope == "session":
            targets = [t for (s, t) in rows if s == "session"]
        else:
            targets = [budget.target]
        for target in targets:
            cap = _cap(budget, target)
            row = rows.get((cap.scope, cap.target))
            tokens, cost = (row.tokens, row.cost) if row else (0, Decimal(0))
            state = BudgetState(
                cap=cap, tokens=tokens, cost=cost, reached=cap.reached(tokens, cost), resets=resets_at(day, tz)
            )
            if state.reached or not only_reached:
                states.append(state)
    return states
