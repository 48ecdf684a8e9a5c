"""Registers every due source with the dispatcher (timers add theirs here)."""

from scheduling.dispatcher import register_source
from scheduling.timers import TimerSource

register_source(TimerSource())
