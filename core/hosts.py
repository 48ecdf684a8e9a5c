"""The host names this server answers to (Django's ALLOWED_HOSTS), including the one the operator used to
open the first-run set-up page.

ALLOWED_HOSTS comes from the environment (or deployment.env in the data dir), default loopback only. A
request naming another host gets 400 (Django's DisallowedHost), with a page saying what to configure.
That protects against DNS rebinding (a hostile site whose name resolves to this server, making a
visitor's browser talk to it as that site) and against links and redirects built from a forged Host.

The first run: the single file started with HOST=0.0.0.0 prints a set-up address, and the operator
opens it from another machine by its address or name, which no one could have listed beforehand. So,
while the set-up is pending (its one-time code file exists when the process starts) and only then, any
host is answered: nothing is reachable then but the set-up page (core.setup leads every page there) and
what needs a token anyway (the API, /ws), and no account exists whose cookie a rebinding site could
ride on. The set-up's completion, which needs the one-time code, records the host the operator used
(`MAIBOT_SETUP_HOST` in deployment.env, added to ALLOWED_HOSTS at every start) and, when the browser came
through a TLS proxy this server does not trust, its origin (`MAIBOT_SETUP_ORIGIN`, added to
CSRF_TRUSTED_ORIGINS, so the login form's CSRF check accepts https). Then the wildcard is gone: at once
in the process that completed it, at the next request in any other (`first_run_hosts_middleware`), and
at every later start (no code file). A host someone else sent during the set-up is never recorded.

Behind a reverse proxy the Host header is what the proxy sends: nginx's default (`proxy_pass
http://127.0.0.1:PORT`) sends the upstream's address, which is loopback and allowed; a proxy that
passes the public name (`proxy_set_header Host $host`) has that name recorded by the set-up, or listed
in ALLOWED_HOSTS. X-Forwarded-Host is never believed (USE_X_FORWARDED_HOST stays off).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from asgiref.sync import iscoroutinefunction
from django.utils.decorators import sync_and_async_middleware

DEFAULT_ALLOWED_HOSTS = "127.0.0.1,localhost,[::1]"
SETUP_CODE_FILE = "setup-code"  # written by core.setup while the set-up is pending
SETUP_HOST = "MAIBOT_SETUP_HOST"
SETUP_ORIGIN = "MAIBOT_SETUP_ORIGIN"
ANY_HOST = "*"


def split_list(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def allowed_hosts(environ: Mapping[str, str], *, data_dir: Path) -> tuple[list[str], bool]:
    """(ALLOWED_HOSTS, whether the first run's wildcard is in it) for a process starting now."""
    hosts = split_list(environ.get("ALLOWED_HOSTS", DEFAULT_ALLOWED_HOSTS))
    hosts += [h for h in split_list(environ.get(SETUP_HOST, "")) if h not in hosts]
    first_run = ANY_HOST not in hosts and (data_dir / SETUP_CODE_FILE).exists()
    return [*hosts, ANY_HOST] if first_run else hosts, first_run


def csrf_trusted_origins(environ: Mapping[str, str]) -> list[str]:
    origins = split_list(environ.get("CSRF_TRUSTED_ORIGINS", ""))
    return origins + [o for o in split_list(environ.get(SETUP_ORIGIN, "")) if o not in origins]


def close_first_run() -> None:
    """Stop answering any host: the set-up is over. The list is changed in place, so the websocket origin
    checks built from it at start-up (channels' AllowedHostsOriginValidator) follow too."""
    from django.conf import settings

    if settings.MAIBOT_FIRST_RUN_ANY_HOST:
        settings.MAIBOT_FIRST_RUN_ANY_HOST = False
        while ANY_HOST in settings.ALLOWED_HOSTS:
            settings.ALLOWED_HOSTS.remove(ANY_HOST)


def _allowed_without_wildcard(domain: str) -> bool:
    from django.conf import settings
    from django.http.request import validate_host

    return validate_host(domain, [h for h in settings.ALLOWED_HOSTS if h != ANY_HOST])


def remember_setup_host(request, env_file: Path) -> str | None:
    """At the set-up's completion: keep the host (and, through an untrusted TLS proxy, the origin) the
    operator's browser used, in deployment.env and in this process's settings. Returns the host recorded
    (None: it was allowed already)."""
    from django.conf import settings
    from django.http.request import split_domain_port

    from core import deployment_env

    host = request.get_host()
    domain, _ = split_domain_port(host)
    values: dict[str, str] = {}
    if domain and not _allowed_without_wildcard(domain):
        values[SETUP_HOST] = domain
        settings.ALLOWED_HOSTS.append(domain)
    origin = request.headers.get("Origin", "")
    scheme = "https" if request.is_secure() else "http"
    if origin == f"https://{host}" and scheme == "http" and origin not in settings.CSRF_TRUSTED_ORIGINS:
        values[SETUP_ORIGIN] = origin
        settings.CSRF_TRUSTED_ORIGINS.append(origin)
    if values:
        # Read at the next start of every process (deployment_env.load_into_environ); this one has them now.
        deployment_env.update(env_file, values)
    return values.get(SETUP_HOST)


@sync_and_async_middleware
def first_run_hosts_middleware(get_response):
    """First in the chain: once the set-up's code file is gone (the set-up was completed by another process,
    or an operator was made with `createsuperuser`), this process stops answering any host too. Costs
    one attribute look per request after that; one stat per request while the set-up is pending."""
    from django.conf import settings

    def check() -> None:
        if settings.MAIBOT_FIRST_RUN_ANY_HOST and not (Path(settings.DATA_DIR) / SETUP_CODE_FILE).exists():
            close_first_run()

    if iscoroutinefunction(get_response):

        async def middleware(request):
            check()
            return await get_response(request)

    else:

        def middleware(request):
            check()
            return get_response(request)

    return middleware
