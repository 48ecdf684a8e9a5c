"""What the processes' log lines look like and which lines are noise: the terminal format (with the
zone's offset on every time) and the filters settings.LOGGING installs."""

from __future__ import annotations

import logging

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
