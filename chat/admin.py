"""Operator admin for chat data; each area keeps its admin classes in its own module."""

from chat import admin_api  # noqa: F401  (registers the ApiToken admin)
