"""Template context for every page: the last failed config reload (shown as a banner in the admin)."""

from django.http import HttpRequest

from maibot import reload


def config_reload(request: HttpRequest) -> dict:
    return {"config_reload_error": reload.last_error}
