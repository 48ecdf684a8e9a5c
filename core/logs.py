"""What the processes' log lines look like and which lines are noise: the terminal format (with the
zone's offset on every time), the filters settings.LOGGING installs, and whether the ASGI server writes
an access log (MAIBOT_ACCESS_LOG, off by default)."""

from __future__ import annotations

import logging
from datetime import datetime

# The paths of health probes: a load balancer or monitor asks them every few seconds, and an answer of
# 503 is the probe's finding (shown on the dashboard's Health), not a server error to log.
PROBE_PATHS = ("/healthz",)


class HealthProbeFilter(logging.Filter):
    """Drops django.request's line for a health probe's 503 ("Service Unavailable: /healthz", logged as
    an error at every start-up until the cluster's first heartbeat, and then listed as a recent error)."""

    def filter(self, record: logging.LogRecord) -> bool:
        request = getattr(record, "request", None)
        path = getattr(request, "path", None)
        return not (getattr(record, "status_code", None) == 503 and path in PROBE_PATHS)


class ZonedFormatter(logging.Formatter):
    """Log lines with the time in the process's zone (Django sets it to TIME_ZONE) and its offset shown:
    `2026-12-24 08:00:00.123+08:00`, never a bare local time."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return datetime.fromtimestamp(record.created).astimezone().isoformat(sep=" ", timespec="milliseconds")


def access_log_enabled() -> bool:
    """Whether the ASGI server writes a line per request (MAIBOT_ACCESS_LOG=1). Off by default: most of a
    terminal's lines were requests (a third of them static files), burying what the bot did."""
    from django.conf import settings

    return settings.MAIBOT_ACCESS_LOG


def daphne_access_log_options(enabled: bool | None = None) -> list[str]:
    """daphne's command-line options for its access log: none when on (daphne writes it to stdout at
    its default verbosity), `--verbosity 0` when off (no access log at all; daphne's own log level is
    set by settings.LOGGING once the application loads, so nothing else is lost)."""
    if enabled is None:
        enabled = access_log_enabled()
    return [] if enabled else ["--verbosity", "0"]
