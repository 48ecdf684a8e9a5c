"""The chat history a planner cycle shows: the reads of a session's recent messages (as prompts.HistoryLine)
and cycle records, and HistoryCache, a runtime's copy of them."""

from __future__ import annotations

from collections import deque

from chat.models import ChatSession, CycleKind, Message, PlannerCycle
from chat.planner.prompts import HistoryLine, render_history_line
from core.config import BotConfig


def history_read(session: ChatSession, window: int) -> list[HistoryLine]:
    rows = Message.objects.filter(session=session).order_by("-time", "-id").values_list(*HistoryLine._fields)
    return [HistoryLine(*row) for row in reversed(rows[:window])]


def recent_cycles_read(session: ChatSession, n: int, *, exclude_pk: int | None) -> list[PlannerCycle]:
    if not n:
        return []
    return list(
        PlannerCycle.objects.filter(session=session, kind=CycleKind.CHAT)
        .exclude(pk=exclude_pk)
        .only("started_at", "action", "reasoning", "outcome", "error")  # not the big prompt
        .order_by("-started_at")[:n]
    )[::-1]


class HistoryCache:
    """A runtime's copy of its session's recent messages, topped up with only the rows stored since
    the last cycle (its own replies, scheduled sends from the cluster, new inbound messages alike)."""

    def __init__(self) -> None:
        self.lines: deque[HistoryLine] = deque()
        self.window = 0
        self.last_pk = 0
        self._rendered: dict[int, str] = {}
        self._render_key: tuple = ()
        self._cycles: deque[PlannerCycle] | None = None

    def recent_cycles(self, session: ChatSession, n: int, *, exclude_pk: int | None) -> list[PlannerCycle]:
        """The session's last chat cycles: read once, then kept as the runtime records them."""
        if self._cycles is None or self._cycles.maxlen != n:
            self._cycles = deque(recent_cycles_read(session, n, exclude_pk=exclude_pk), maxlen=n)
        return [c for c in self._cycles if c.pk != exclude_pk]

    def remember_cycle(self, cycle: PlannerCycle) -> None:
        if self._cycles is not None:
            # Only what the prompt shows: the full conversation stays in the database.
            self._cycles.append(
                PlannerCycle(
                    pk=cycle.pk,
                    started_at=cycle.started_at,
                    action=cycle.action,
                    reasoning=cycle.reasoning,
                    outcome=cycle.outcome,
                    error=cycle.error,
                )
            )

    def rendered(self, cfg: BotConfig):
        """A line renderer that renders each message once (per nickname and time zone)."""
        tz = cfg.tzinfo
        key = (cfg.bot.nickname, tz.key)
        if key != self._render_key:
            self._rendered, self._render_key = {}, key
        live = {line.pk for line in self.lines}
        for pk in [pk for pk in self._rendered if pk not in live]:
            del self._rendered[pk]

        def render(m: HistoryLine) -> str:
            text = self._rendered.get(m.pk)
            if text is None:
                text = self._rendered[m.pk] = render_history_line(m, cfg, tz)
            return text

        return render

    def refresh(self, session: ChatSession, window: int) -> list[HistoryLine]:
        if window != self.window or not self.lines:
            self.lines = deque(history_read(session, window), maxlen=window)
            self.window = window
        else:
            rows = (
                Message.objects.filter(session=session, pk__gt=self.last_pk)
                .order_by("time", "id")
                .values_list(*HistoryLine._fields)
            )
            self.lines.extend(HistoryLine(*row) for row in rows)
        if self.lines:
            self.last_pk = max(self.last_pk, max(line.pk for line in self.lines))
        return list(self.lines)
