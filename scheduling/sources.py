"""Registers every due source with the dispatcher (timers add theirs here)."""

from scheduling.dispatcher import register_source
from scheduling.life.timers import FiringHandOff, TimerSource

# Firings are enqueued from their own thread so the dispatcher thread only claims.
register_source(TimerSource(enqueue=FiringHandOff().submit))
