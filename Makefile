# maibot: `make run` (start it) and `make test` (the whole suite) are all a fresh machine needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
PG_URL ?= postgres://postgres@127.0.0.1:5432/maibot
REDIS_TEST_URL ?= redis://127.0.0.1:6379/1
# Modules are byte-compiled once, on first import, into __pycache__ (ignored by git): a process that
# compiles the project's modules afresh at every start costs every server, cluster and test a share.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: messages dist run run-cluster test test-fast test-live test-postgres lint bench venv venv-dev venv-mm07 clean

# Environments are made with pip; with UV=<path to uv> (CI does this) uv installs the same pins in a
# fraction of the time (leaving byte-compilation to the first import). Either way the environment keeps
# its own pip (the plugin host installs plugins' dependencies with it).
UV ?=
install = $(if $(UV),$(UV) pip install -q --python $(1)/bin/python,$(1)/bin/pip install -q)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(if $(UV),,$(BIN)/pip install -q --upgrade pip)

$(VENV)/.runtime: requirements.txt | $(BIN)/python
	$(call install,$(VENV)) -r requirements.txt
	touch $@

$(VENV)/.dev: requirements.txt requirements-dev.txt | $(BIN)/python
	$(call install,$(VENV)) -r requirements.txt -r requirements-dev.txt
	touch $(VENV)/.runtime $@

venv: $(VENV)/.runtime
venv-dev: $(VENV)/.dev

# The maim_message 0.7.x (Socket.IO) client lives in its own environment: one environment cannot
# hold both wire versions. Tests run it as a subprocess.
venv-mm07: .venv-mm07/.installed
.venv-mm07/.installed: tests/mm07/requirements.txt
	test -x .venv-mm07/bin/python || $(PYTHON) -m venv .venv-mm07
	$(call install,.venv-mm07) -r tests/mm07/requirements.txt
	touch $@

# dist/maibot.pyz: the project and every dependency in one file (shiv), run with `python3 maibot.pyz`.
# Dependencies are the wheels pip picks for the building interpreter: build with the CPython (3.11+, Linux
# x86_64) the file is meant for. Children find the packages through PYTHONPATH (--extend-pythonpath).
# --no-compile: pip writes no .pyc (a third quicker); the file's first start unpacks it with progress lines
# and compiles every module into the extraction once (maibot/single_file.py, put in by its `finish` step),
# so later starts read bytecode whatever PYTHONDONTWRITEBYTECODE says.
# DIST_PYTHON=python3.12 builds for that interpreter instead (it needs shiv==1.0.8 installed).
DIST_PYTHON ?=
SHIV = $(if $(DIST_PYTHON),$(DIST_PYTHON) -m shiv,$(BIN)/shiv)
# With UV=<path to uv> (as for the environments), uv installs the same pins into the staging folder and
# shiv only packs it: the same file in a third of the time.
SHIV_ARGS = -o dist/maibot.pyz -e maibot.cli:main -p "/usr/bin/env python3" --extend-pythonpath
dist: $(if $(DIST_PYTHON),,venv-dev)
	rm -rf build dist/maibot.pyz && mkdir -p dist
ifneq ($(UV),)
	$(UV) pip install -q --python $(if $(DIST_PYTHON),$(DIST_PYTHON),$(BIN)/python) --target build/site \
		--only-binary :all: --no-binary maibot .
	rm -f build/site/.lock
	$(SHIV) $(SHIV_ARGS) --site-packages build/site >/dev/null
else
	$(SHIV) --quiet $(SHIV_ARGS) --only-binary=:all: --no-binary=maibot --no-compile .
endif
	$(if $(DIST_PYTHON),$(DIST_PYTHON),$(BIN)/python) -m maibot.single_file dist/maibot.pyz
	rm -rf build *.egg-info
	@ls -l dist/maibot.pyz

run: venv
	HOST=$(HOST) PORT=$(PORT) $(BIN)/python manage.py serve --bootstrap

# The multi-process deployment on this machine: HAProxy on HOST:PORT in front of two ASGI servers
# (127.0.0.1:PORT+1, PORT+2) and two task clusters, on PostgreSQL + Redis (docs/scale-out.md).
CLUSTER_DATABASE_URL ?= $(PG_URL)
CLUSTER_REDIS_URL ?= redis://127.0.0.1:6379/0
run-cluster: venv
	@command -v haproxy >/dev/null || test -x /usr/sbin/haproxy || { echo "haproxy is required: apt-get install haproxy" >&2; exit 1; }
	DATABASE_URL=$(CLUSTER_DATABASE_URL) REDIS_URL=$(CLUSTER_REDIS_URL) HOST=$(HOST) PORT=$(PORT) \
		$(BIN)/python manage.py run_cluster --prepare

# Tests run on PYTEST_WORKERS parallel workers (pytest-xdist), each with its own data dir, test database
# and Redis database: most live tests wait on servers, so two workers finish in about half the time.
PYTEST_WORKERS ?= 2

# Both tiers. The fast tier alone (in-process, no servers, clusters or browser): `make test-fast`;
# the live tier alone: `make test-live`. PYTEST_ARGS adds pytest options (e.g. PYTEST_ARGS=-x).
test: venv-dev venv-mm07
	MAIBOT_DATA_DIR=$(CURDIR)/.test-data $(BIN)/python -m pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

test-fast: venv-dev
	MAIBOT_DATA_DIR=$(CURDIR)/.test-data $(BIN)/python -m pytest -m "not live" -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

test-live: venv-dev venv-mm07
	MAIBOT_DATA_DIR=$(CURDIR)/.test-data $(BIN)/python -m pytest -m live -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

# The same suite on PostgreSQL (and Redis for the channel layer and the task broker).
# Left out, besides the Chromium pages and the source-tree checks: tests marked backend_independent, whose
# outcome the database and the notifier cannot change (plugin runners, their sandbox, host and hooks, plugin
# installs, MCP client links, the data dir's modes, the config editor and reload, addresses behind a reverse
# proxy); `make test` runs them.
# tests/maibot/test_pyz.py is left to `make test`: the single file brings its own SQLite data dir (it uses
# neither suite's database), and one build at a time in this folder.
test-postgres: venv-dev venv-mm07
	MAIBOT_DATA_DIR=$(CURDIR)/.test-data-pg DATABASE_URL=$(PG_URL) REDIS_URL=$(REDIS_TEST_URL) $(BIN)/python -m pytest \
		-n $(PYTEST_WORKERS) --ignore=tests/maibot/test_pyz.py -m "not browser and not static and not backend_independent" $(PYTEST_ARGS)

lint: venv-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: venv-dev
	$(BIN)/python bench/delivery.py
	$(BIN)/python bench/timers.py
	$(BIN)/python bench/planner.py
	$(BIN)/python bench/ingest.py
	$(BIN)/python bench/api.py
	$(BIN)/python bench/plugins.py
	$(BIN)/python bench/plugin_runner.py
	$(BIN)/python bench/due_query.py
	$(BIN)/python bench/sessions.py

clean:
	rm -rf .test-data .test-data-pg build dist *.egg-info

# The console's translations (console/locale): every marked string into both catalogs (then translate the
# new ones in zh_Hans; en is the source text, filled by msgen), compiled. Needs GNU gettext. New entries
# start empty, never as fuzzy guesses: the project's makemessages runs msgmerge with --no-fuzzy-matching.
MESSAGES_IGNORE = $(foreach d,tests bench docs locale data dist build site maibot-data,--ignore=$(d))
messages: venv
	$(BIN)/python manage.py makemessages -l zh_Hans -l en --no-obsolete --no-location $(MESSAGES_IGNORE)
	msgen -o console/locale/en/LC_MESSAGES/django.po console/locale/en/LC_MESSAGES/django.po
	$(BIN)/python manage.py compilemessages -l zh_Hans -l en -i ".venv*" -i ".ci"
