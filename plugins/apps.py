from django.apps import AppConfig


class PluginsConfig(AppConfig):
    """The host for unmodified MaiBot SDK plugins (maibot-plugin-sdk): loading, components, capabilities."""

    name = "plugins"
    verbose_name = "Plugins"
