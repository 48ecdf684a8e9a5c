"""The project package as an app, only so that its management commands (serve, bootstrap, …) are found."""

from django.apps import AppConfig


class ProjectConfig(AppConfig):
    name = "maibot"
    label = "project"
    verbose_name = "Project"
