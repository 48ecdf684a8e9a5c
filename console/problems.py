"""What needs the operator now, shown first on the dashboard: a failing model, a budget reached, the task
cluster down, refused adapter connections, no adapter at all, outbound messages that failed or went
unconfirmed. Each problem says what to do, and links to where it is done when the operator may go there
(a link the user has no permission for is left out, the advice stays)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from chat.agent.budget import budget_states
from chat.models import AdapterConnection
from console.model_health import failing_models
from core.config import format_shown, get_config
from core.models import LogEntry

REFUSALS_WINDOW = timedelta(hours=1)
# chat.gateway.auth logs each refused adapter connection (once per address and reason per minute).
REFUSAL_LOGGER = "chat.gateway.auth"


@dataclass(frozen=True)
class Problem:
    kind: str  # model, budget, refused, adapter, delivery: the row's CSS class
    text: str
    advice: str
    url: str = ""  # "" when the operator may not open the page that fixes it
    link: str = ""


def _link(user, perm: str, url: str, text: str) -> dict[str, str]:
    return {"url": url, "link": text} if user.has_perm(perm) else {}


def _model_problems(user) -> list[Problem]:
    tz = get_config().tzinfo
    return [
        Problem(
            "model",
            _("The model “%(name)s” is failing since %(since)s: %(status)s")
            % {"name": f.name, "since": format_shown(f.since, tz), "status": f.status},
            _("Check its API key and address and test it; until then private chats get a short apology."),
            **_link(user, "maibot.test_llm_models", reverse("console-models"), _("Models")),
        )
        for f in failing_models()
    ]


def _budget_problems(user) -> list[Problem]:
    tz = get_config().tzinfo
    return [
        Problem(
            "budget",
            _("The daily budget “%(cap)s” is reached: calls under it wait until %(resets)s.")
            % {"cap": s.cap.label, "resets": format_shown(s.resets, tz)},
            _("Raise the cap (llm.budgets in the configuration) or wait for the reset."),
            **_link(user, "maibot.change_config", reverse("console-config-raw"), _("Configuration (TOML)")),
        )
        for s in budget_states(only_reached=True)
    ]


def _cluster_problems(user, health: dict) -> list[Problem]:
    cluster = health.get("cluster", {})
    if cluster.get("ok", True):
        return []
    age = cluster.get("age_seconds")
    return [
        Problem(
            "cluster",
            _("The task cluster is not running: scheduled messages and timers wait.")
            if age is None
            else _("The task cluster has not beaten for %(age)d s: scheduled messages and timers wait.") % {"age": age},
            format_html(
                _(
                    "{serve} (as {make_run} and maibot.pyz run it) starts it and restarts it when it dies: the live "
                    "logs say why it stops. A web server started alone needs {run_cluster} beside it."
                ),
                serve=format_html("<code>{}</code>", "manage.py serve"),
                make_run=format_html("<code>{}</code>", "make run"),
                run_cluster=format_html("<code>{}</code>", "manage.py run_cluster"),
            ),
            **_link(user, "maibot.view_console", reverse("console-logs"), _("Live logs")),
        )
    ]


def _adapter_problems(user, now: datetime) -> list[Problem]:
    problems = []
    refused = LogEntry.objects.filter(
        logger=REFUSAL_LOGGER, level__gte=30, created_at__gte=now - REFUSALS_WINDOW, message__contains="refused"
    ).count()
    connect = _link(user, "maibot.view_console", reverse("console-connect"), _("Connect an adapter"))
    if refused:
        problems.append(
            Problem(
                "refused",
                ngettext(
                    "%(n)d adapter connection was refused in the last hour.",
                    "%(n)d adapter connections were refused in the last hour.",
                    refused,
                )
                % {"n": refused},
                _("Give the adapter the token and address shown on the Connect page (the reason is in the logs)."),
                **connect,
            )
        )
    if not AdapterConnection.objects.filter(disconnected_at__isnull=True).exists():
        problems.append(
            Problem(
                "adapter",
                _("No adapter is connected: the bot hears nobody and can send nothing."),
                _("Start the NapCat adapter with the snippet on the Connect page."),
                **connect,
            )
        )
    return problems


def _delivery_problems(user, deliveries: dict) -> list[Problem]:
    counts = deliveries["total"].open
    failed, unconfirmed = counts.get("failed", 0), counts.get("unconfirmed", 0)
    if not failed and not unconfirmed:
        return []
    url = reverse("admin:chat_message_changelist") + "?delivery=" + ("failed" if failed else "unconfirmed")
    return [
        Problem(
            "delivery",
            _("Outbound messages not delivered: %(failed)d failed, %(unconfirmed)d unconfirmed.")
            % {"failed": failed, "unconfirmed": unconfirmed},
            _("Open each to read why, fix the adapter, then resend them from the messages list."),
            **_link(user, "chat.view_message", url, _("Messages")),
        )
    ]


def problems(user, deliveries: dict, health: dict, now: datetime | None = None) -> list[Problem]:
    """The problems, the most pressing first; `deliveries` is console.dashboard.delivery_counts(), `health`
    the checks of console.dashboard.health_checks()."""
    now = now or timezone.now()
    return [
        *_model_problems(user),
        *_budget_problems(user),
        *_cluster_problems(user, health),
        *_adapter_problems(user, now),
        *_delivery_problems(user, deliveries),
    ]
