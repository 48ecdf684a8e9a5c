"""`manage.py runserver`: the development server, serving the ASGI application (websockets included) with
daphne, as daphne's own app does. Only this command imports daphne: as an installed app, it would import
Twisted and the server into every process Django sets up (the cluster, its workers, every command)."""

from daphne.management.commands.runserver import Command as DaphneRunserver


class Command(DaphneRunserver):
    help = "Run the development server (daphne: HTTP and websockets of the ASGI application)."
