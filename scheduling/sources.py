"""Registers every due source with the dispatcher (timers add theirs here)."""
