"""Django settings for maibot: every deployment knob comes from the environment, with embedded defaults.

Embedded default (nothing else installed): SQLite in the data dir, django-q2 ORM broker, in-memory
channel layer. Scale-out: set DATABASE_URL (PostgreSQL) and REDIS_URL (channels_redis + Redis broker).
The bot's own behaviour (persona, limits, model) lives in bot_config.toml, read through core.config.
"""

import importlib.util
import os
import secrets
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from core import datadir, deployment_env, hosts
from core.adapter_tokens import parse_adapter_tokens
from core.networks import parse_networks

BASE_DIR = Path(__file__).resolve().parent.parent

DATA_DIR = Path(os.environ.get("MAIBOT_DATA_DIR") or BASE_DIR / "data").resolve()
if os.environ.get("PYTEST_XDIST_WORKER"):
    # Parallel test workers (`make test-fast`) each keep their config file, media and databases apart.
    DATA_DIR = DATA_DIR / os.environ["PYTEST_XDIST_WORKER"]
# The data dir is the server user's alone (core.datadir): the folder and the files directly in it
# are made 0700/0600 now, before the database's first connection (SQLite gives its -wal/-shm the
# database file's mode, and a new database file is created 0600 below). Files written later are
# written private explicitly; the bootstrap and each server and cluster start see to everything deeper.
# (No process-wide umask: the bytecode caches this process writes beside the code must stay readable by
# the plugin runners, which run as a uid of their own.)
DATA_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
datadir.make_private(DATA_DIR, deep=False)
MEDIA_ROOT = DATA_DIR / "media"
# Django's storage chmods each saved file (0o644 by default): media are kept private like the rest.
FILE_UPLOAD_PERMISSIONS = 0o600
FILE_UPLOAD_DIRECTORY_PERMISSIONS = 0o700
# The API key and adapter tokens the set-up page saved (the environment wins over them).
deployment_env.load_into_environ(DATA_DIR / deployment_env.FILE_NAME)
MEDIA_URL = "/media/"

HOST = os.environ.get("HOST", "127.0.0.1")
PORT = int(os.environ.get("PORT", "8000"))


def _secret_key() -> str:
    """SECRET_KEY from the environment, else one generated once into the data dir."""
    if os.environ.get("SECRET_KEY"):
        return os.environ["SECRET_KEY"]
    key_file = DATA_DIR / "secret_key"
    if not key_file.exists():
        # O_EXCL: two processes starting at once must not write two different keys.
        try:
            fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_urlsafe(50))
    return key_file.read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = os.environ.get("DEBUG", "").lower() in {"1", "true", "yes"}
# Comma-separated CIDRs of the reverse proxies in front of this server (nginx, Caddy, run_cluster's
# HAProxy): only from them are X-Forwarded-For and X-Forwarded-Proto believed (maibot.proxies). Empty:
# the peer is the client. A bad entry stops start-up naming it.
MAIBOT_TRUSTED_PROXIES = parse_networks(os.environ.get("MAIBOT_TRUSTED_PROXIES", ""), name="MAIBOT_TRUSTED_PROXIES")
# The host names answered (default loopback), plus the one the operator opened the set-up page with;
# any host only while the first-run set-up is pending (core.hosts).
ALLOWED_HOSTS, MAIBOT_FIRST_RUN_ANY_HOST = hosts.allowed_hosts(os.environ, data_dir=DATA_DIR)
CSRF_TRUSTED_ORIGINS = hosts.csrf_trusted_origins(os.environ)

INSTALLED_APPS = [
    # The project package (label "project"): only its management commands (serve, bootstrap, …). First, so
    # that its `runserver` (daphne's, serving the ASGI app) wins over staticfiles'. daphne itself is no app
    # here: its app module imports Twisted and the server into every process Django sets up.
    "maibot",
    # Django's admin, serving the console's site (its sidebar led by the bot's pages).
    "console.apps.ConsoleAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    # Not "ninja": its app module imports django-ninja (and through it django.test, Jinja2, unittest:
    # 13 MiB) into every process Django sets up, the cluster and its forks too. Its Swagger UI files are
    # found through NINJA_DIR below (api.http.OfflineSwagger), never a CDN.
    # The admin login's limit on wrong passwords (core.login_lock); before console, whose admin
    # re-registers its attempts' page.
    "axes",
    # scheduling before django_q: its `qcluster` command wraps django-q2's to run the dispatcher.
    # The bottom layer (label "maibot": its tables and permissions keep the project's old app label).
    "core",
    "chat",
    "scheduling",
    "api",
    "plugins",
    "console",
    "django_q",
]

MIDDLEWARE = [
    # First: the first run's "any host" ends in every process once the set-up is done (core.hosts).
    "core.hosts.first_run_hosts_middleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    # The console's language: the operator's choice (a cookie, set_language), else the browser's.
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # On the single file's first run (no operator yet), pages lead to the browser set-up (core.setup).
    "core.setup.setup_middleware",
    # Times on pages and in forms in the bot's time zone (bot.time_zone), not the server's.
    "console.middleware.bot_time_zone_middleware",
    # Last: turns a login refused by the failed-password limit into its page (core.login_lock).
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "maibot.urls"

# django-ninja's own templates and static files (Swagger UI), found without importing the package.
NINJA_DIR = Path(importlib.util.find_spec("ninja").submodule_search_locations[0])

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates", NINJA_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "console.context_processors.config_reload",
                "console.context_processors.llm_budgets",
            ],
        },
    },
]

WSGI_APPLICATION = None
ASGI_APPLICATION = "maibot.asgi.application"

# --- database -------------------------------------------------------------------------------------
SQLITE_OPTIONS = {
    # WAL + IMMEDIATE transactions + a busy timeout: no "database is locked" between the ASGI
    # process and the cluster (Django >= 5.1 runs init_command on every new connection).
    "transaction_mode": "IMMEDIATE",
    "timeout": 20,
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
}

DATABASE_URL = os.environ.get("DATABASE_URL", "")
if DATABASE_URL:
    _db = dj_database_url.parse(DATABASE_URL, conn_max_age=0)
else:
    _db = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(DATA_DIR / "db.sqlite3")}
if _db["ENGINE"] == "django.db.backends.sqlite3":
    _db["OPTIONS"] = {**SQLITE_OPTIONS, **_db.get("OPTIONS", {})}
    # Tests run processes (qcluster, daphne) against the test database: it must be a file.
    _db["TEST"] = {"NAME": os.environ.get("MAIBOT_TEST_DB") or str(DATA_DIR / "test.sqlite3")}
    datadir.create_private(_db["NAME"])  # SQLite takes an empty file as a new database
DATABASES = {"default": _db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- channels and the task cluster ----------------------------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL", "")
if REDIS_URL and os.environ.get("PYTEST_XDIST_WORKER"):
    # Parallel test workers keep their channel layers and task queues apart too: worker gwN uses the
    # Redis database after the given one plus N (…/1 → gw0 on …/2, gw1 on …/3).
    from urllib.parse import urlsplit, urlunsplit

    _url = urlsplit(REDIS_URL)
    _index = int(_url.path.strip("/") or 0) + 1 + int(os.environ["PYTEST_XDIST_WORKER"].removeprefix("gw"))
    REDIS_URL = urlunsplit(_url._replace(path=f"/{_index}"))
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # redis-py 8 reads with a 5 s socket timeout by default, the same 5 s channels_redis blocks
            # in BZPOPMIN while a channel is idle: an idle receive then raised TimeoutError and ended
            # the consumer waiting on it. Reads may take longer than the block; a dead server is still
            # noticed within the timeout.
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 30}], "capacity": 5000},
        }
    }
else:
    # Channels' in-memory layer, its expiry sweep amortised (10,000 live session runtimes: see the class).
    CHANNEL_LAYERS = {"default": {"BACKEND": "maibot.channel_layers.SweepingInMemoryChannelLayer"}}

Q_CLUSTER = {
    "name": os.environ.get("MAIBOT_Q_NAME", "maibot"),
    # At most this many worker processes, forked only while there are tasks (scheduling.taskqueue).
    "workers": int(os.environ.get("MAIBOT_Q_WORKERS", "2")),
    # A life-loop turn has a hard 120 s timeout of its own; retry must exceed timeout.
    "timeout": 300,
    "retry": 360,
    "max_attempts": 3,
    "catch_up": False,
    "poll": 0.2,
    "ack_failures": True,
    "save_limit": 1000,
    "label": "Task queue",
    # django-q2's Schedule rows are not used (the dispatcher is the scheduler): no look at them every 30 s.
    "scheduler": False,
}
# Workers idle this long with nothing queued end; the next task forks them again (scheduling.taskqueue).
MAIBOT_Q_IDLE_WORKER_SECONDS = float(os.environ.get("MAIBOT_Q_IDLE_WORKER_SECONDS", "60"))
if REDIS_URL:
    Q_CLUSTER["redis"] = REDIS_URL
else:
    # The ORM broker's pusher waits on a local wake socket instead of querying every `poll` seconds
    # (0: no sleep of the broker's own; scheduling.taskqueue.WakeableORM waits instead).
    Q_CLUSTER.update(orm="default", broker_class="scheduling.taskqueue.WakeableORM", poll=0)

# --- i18n / time ----------------------------------------------------------------------------------
# Without a choice or a browser preference: English. Each language is named in itself.
LANGUAGE_CODE = "en"
LANGUAGES = [("zh-hans", "简体中文"), ("en", "English")]
# The console's catalogs (makemessages writes every string there; tests/console/test_translations.py).
LOCALE_PATHS = [BASE_DIR / "console" / "locale"]
LANGUAGE_COOKIE_AGE = 365 * 24 * 3600  # the operator's choice is remembered
TIME_ZONE = os.environ.get("MAIBOT_TIME_ZONE", "Asia/Shanghai")
USE_I18N = True
USE_TZ = True
# One numeric date format with the zone's offset on every console page, in every language.
FORMAT_MODULE_PATH = ["console.formats"]

STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"
# The project's own static files (the console's icon).
STATICFILES_DIRS = [d for d in [BASE_DIR / "templates" / "static", NINJA_DIR / "static"] if d.is_dir()]
LOGIN_URL = "/admin/login/"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

# --- the login's limit on wrong passwords (django-axes, configured in core.login_lock) -----------------


def _positive(name: str, default: float, kind: type[int] | type[float]) -> float:
    """A positive number from the environment (`kind`: int or float); anything else stops start-up."""
    value = os.environ.get(name, "").strip()
    try:
        number = kind(value) if value else default
    except ValueError:
        number = 0
    if not 0 < number <= 10**6:
        raise ImproperlyConfigured(f"{name}: a positive {'whole ' if kind is int else ''}number, got {value!r}")
    return number


# Threads of the ASGI process serving HTTP requests, each with its own database connection
# (maibot.http_handler).
HTTP_THREADS = int(_positive("MAIBOT_HTTP_THREADS", 4, int))
if HTTP_THREADS > 64:
    raise ImproperlyConfigured(f"MAIBOT_HTTP_THREADS: at most 64, got {HTTP_THREADS}")

# Axes' backend first: it refuses a locked-out login before the password is checked.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
# This many failures from one address, or for one username, lock logging in for MAIBOT_LOGIN_LOCKOUT_MINUTES.
AXES_FAILURE_LIMIT = int(_positive("MAIBOT_LOGIN_FAILURE_LIMIT", 5, int))
AXES_COOLOFF_TIME = timedelta(minutes=_positive("MAIBOT_LOGIN_LOCKOUT_MINUTES", 15, float))
# The client is the address maibot.proxies decided; axes never reads forwarding headers itself.
AXES_CLIENT_IP_CALLABLE = "core.login_lock.client_address"
AXES_LOCKOUT_PARAMETERS = "core.login_lock.lockout_parameters"
AXES_LOCKOUT_CALLABLE = "core.login_lock.lockout_response"
# Attempts while locked are refused without being counted; a success does not clear the count.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_RESET_ON_SUCCESS = False
# Logged failures name the address, not the username typed (it may be a password typed in the wrong box).
AXES_SENSITIVE_PARAMETERS = ["username"]
AXES_VERBOSE = False

# --- adapters -------------------------------------------------------------------------------------
# Comma-separated `platform:token` entries (a bare token is qq's): the token an adapter sends (the raw
# `Authorization` / `x-apikey` header) admits it as that platform only (core.adapter_tokens).
MAIBOT_ADAPTER_TOKENS = parse_adapter_tokens(os.environ.get("MAIBOT_ADAPTER_TOKENS", ""), name="MAIBOT_ADAPTER_TOKENS")
# Comma-separated CIDRs whose adapters are admitted without a token (legacy adapters that cannot send
# one); a bad entry stops start-up naming it (chat.gateway.auth).
MAIBOT_ADAPTER_ALLOW_FROM = parse_networks(
    os.environ.get("MAIBOT_ADAPTER_ALLOW_FROM", ""), name="MAIBOT_ADAPTER_ALLOW_FROM"
)

# --- plugins' Python dependencies ----------------------------------------------------------------
# Installing code is the deployment's decision, never the bot config's (plugins.deps): whether a plugin's
# missing packages are pip-installed when it loads, and the package index pip uses (unset: pip's own
# configuration of the server's user). The extra index may list several URLs, separated by spaces.
MAIBOT_PLUGIN_AUTO_INSTALL = os.environ.get("MAIBOT_PLUGIN_AUTO_INSTALL", "").lower() in {"1", "true", "yes"}


def _index_urls(name: str, *, many: bool) -> list[str]:
    from django.core.exceptions import ImproperlyConfigured

    urls = os.environ.get(name, "").split()
    if len(urls) > 1 and not many:
        raise ImproperlyConfigured(f"{name}: one URL (more indexes go in MAIBOT_PIP_EXTRA_INDEX_URL)")
    for url in urls:
        if not url.startswith(("https://", "http://", "file://")):
            raise ImproperlyConfigured(f"{name}: {url!r} is not an http(s):// or file:// URL")
    return urls


MAIBOT_PIP_INDEX_URL = "".join(_index_urls("MAIBOT_PIP_INDEX_URL", many=False))
MAIBOT_PIP_EXTRA_INDEX_URLS = _index_urls("MAIBOT_PIP_EXTRA_INDEX_URL", many=True)

# --- plugins --------------------------------------------------------------------------------------
# Plugin runners start inside the sandbox (plugins.sandbox: bubblewrap); without one they are refused,
# unless the deployment opts out with "off" (they then run as the server's user, seeing what it sees).
MAIBOT_PLUGIN_SANDBOX = os.environ.get("MAIBOT_PLUGIN_SANDBOX", "").strip().lower() or "on"
if MAIBOT_PLUGIN_SANDBOX not in ("on", "off"):
    raise ImproperlyConfigured(f"MAIBOT_PLUGIN_SANDBOX: {MAIBOT_PLUGIN_SANDBOX!r} is neither on nor off")
# Plugin ids (comma-separated) whose runners get this machine's network, loopback services included.
MAIBOT_PLUGIN_HOST_NETWORK = frozenset(
    p.strip() for p in os.environ.get("MAIBOT_PLUGIN_HOST_NETWORK", "").split(",") if p.strip()
)
# Installing a plugin from the console (plugins.install): the largest upload (the server answers 413 to a
# bigger request before reading it), what its archive may unpack to and hold, how long a git clone may
# take, and the git URL schemes accepted. Fixed here, not in the environment: a test widens the schemes.
MAIBOT_PLUGIN_INSTALL_MAX_UPLOAD = 20 * 1024 * 1024
MAIBOT_PLUGIN_INSTALL_MAX_UNPACKED = 64 * 1024 * 1024
MAIBOT_PLUGIN_INSTALL_MAX_ENTRIES = 2000
MAIBOT_PLUGIN_INSTALL_GIT_TIMEOUT = 120.0
MAIBOT_PLUGIN_INSTALL_GIT_SCHEMES = ("https",)

# The server and the cluster run the config watcher, the log writer and the heartbeat (core.process).
MAIBOT_CONSOLE_SERVICES = os.environ.get("MAIBOT_CONSOLE_SERVICES", "1") != "0"

# --- logging --------------------------------------------------------------------------------------
LOG_LEVEL = os.environ.get("LOG_LEVEL", "INFO")
# A line per HTTP request and websocket (the ASGI server's access log, and runserver's): off unless set.
MAIBOT_ACCESS_LOG = os.environ.get("MAIBOT_ACCESS_LOG", "").lower() in {"1", "true", "yes"}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "line": {
            "()": "core.logs.ZonedFormatter",
            "format": "%(asctime)s %(levelname)-7s %(name)s %(module)s:%(lineno)d %(message)s",
        },
    },
    "filters": {
        "health_probes": {"()": "core.logs.HealthProbeFilter"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "line"},
        # Copies INFO+ records to the live log page; inactive until the server or the cluster starts
        # it (core.process), so migrate and tests never write logs to the database.
        "console_db": {"class": "core.logdb.DatabaseLogHandler", "level": "INFO"},
    },
    "root": {"handlers": ["console", "console_db"], "level": LOG_LEVEL},
    "loggers": {
        "django": {"level": "INFO"},
        "django.request": {"filters": ["health_probes"]},
        "daphne": {"level": "WARNING"},
        # `manage.py runserver`'s access log (daphne's runserver logs each request here).
        "django.channels.server": {"level": "INFO" if MAIBOT_ACCESS_LOG else "WARNING"},
        "django_q": {"level": "INFO"},
        # Failures and lock-outs are warnings; its INFO lines narrate every login.
        "axes": {"level": "WARNING"},
    },
}
