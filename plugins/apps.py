from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class PluginsConfig(AppConfig):
    """The host for unmodified MaiBot SDK plugins (maibot-plugin-sdk): loading, components, capabilities."""

    name = "plugins"
    verbose_name = _("Plugins")

    def ready(self) -> None:
        from plugins.capabilities import maisaka

        # What plugins add to a chat (maisaka.context.append, proactive requests) reaches its next prompt.
        maisaka.register_context_block()

        from plugins import host
        from scheduling.life import loop

        # A cluster worker's first life-loop model turn starts its plugin host (life-loop tools).
        loop.add_turn_setup("plugins", host.start_for_life_loop)
