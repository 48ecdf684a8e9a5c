"""Per-request settings of the console's pages: times are shown (and typed into forms) in the bot's time
zone, `bot.time_zone` of the config in force, which may differ from the server's TIME_ZONE."""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.decorators import sync_and_async_middleware

from core.config import get_config


@sync_and_async_middleware
def bot_time_zone_middleware(get_response):
    """Activates the bot's time zone for the request (the admin's own date rendering and its date
    inputs then use it, as the console's columns do)."""
    if iscoroutinefunction(get_response):

        async def middleware(request: HttpRequest) -> HttpResponse:
            with timezone.override(get_config().tzinfo):
                return await get_response(request)

    else:

        def middleware(request: HttpRequest) -> HttpResponse:
            with timezone.override(get_config().tzinfo):
                return get_response(request)

    return middleware
