# Two entry points (see README): `make demo` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-load lint format bench fuzz soak rehearsal gpu-check mcore06 clean

# Packages install without byte-compiling every module (pip's default; a minute here): what runs
# compiles on first import instead, so byte code must be written even where the environment
# says not to (PYTHONDONTWRITEBYTECODE, set on some CI images), or every process would compile
# torch anew.
unexport PYTHONDONTWRITEBYTECODE

$(STAMP): pyproject.toml setup.py src/tokentape/_src/tape/_cwalk.c src/tokentape/_src/megatron/_cgreedy.c Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check --no-compile -e '.[dev,plot,torch,megatron,ray,s3,recipes]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/tokentape demo

# Style, the import contract (.importlinter: one-way layers) and the types.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

# The suite on every CPU (pytest-xdist: one worker per CPU; each has its own S3 server and
# temporary directories), with `make lint` beside it (one process, mostly mypy: it fits in the
# suite's waits); its output follows the suite's, and either failing fails `make test`.
test: $(STAMP)
	@log=$$(mktemp); $(MAKE) --no-print-directory lint > "$$log" 2>&1 & lint=$$!; \
	$(BIN)/pytest -q -n auto; tests=$$?; \
	wait $$lint; linted=$$?; cat "$$log"; rm -f "$$log"; \
	if [ $$linted -ne 0 ]; then echo "make test: lint failed"; fi; \
	[ $$tests -eq 0 ] && [ $$linted -eq 0 ]

# The same suite while `nproc` busy processes compete for the CPUs (started and stopped here):
# no test may decide anything from wall-clock time.
test-load: lint
	$(BIN)/python tests/tools/under_load.py -- $(BIN)/pytest -q -n auto

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# Longer runs than CI's: every fuzz test with TOKENTAPE_FUZZ_EXAMPLES examples (default 5000).
fuzz: $(STAMP)
	TOKENTAPE_HYPOTHESIS_PROFILE=fuzz $(BIN)/pytest -q -m fuzz

# The kill campaign (not in CI's time budget): see docs/reliability.md.
soak: $(STAMP)
	$(BIN)/python tests/tools/soak.py

# Longer than CI's: the multi-node tests (tests/cluster: a three-node Ray cluster, two torchrun
# nodes, each with a node killed) REHEARSAL_ROUNDS times over, then the fleet model with its
# calibration at 50 ms a request (docs/cluster.md).
REHEARSAL_ROUNDS ?= 5
rehearsal: $(STAMP)
	@for i in $$(seq $(REHEARSAL_ROUNDS)); do \
		echo "rehearsal round $$i of $(REHEARSAL_ROUNDS)"; \
		$(BIN)/pytest -q -m multinode -n 2 || exit 1; \
	done
	$(BIN)/python benchmarks/fleet_sim.py --latency-ms 50

bench: $(STAMP)
	$(BIN)/python benchmarks/run.py

gpu-check: $(STAMP)  ## needs a CUDA device; exits 2 with one line without one
	$(BIN)/python benchmarks/gpu_check.py

# megatron-core 0.6.0, whose data cache layout differs (no split in the file names), in its own
# environment, never in .venv: tests/megatron/test_megatron_versions.py builds caches with it.
MCORE06 := .venv-mcore06
$(MCORE06)/.installed:
	$(PYTHON) -m venv $(MCORE06)
	$(MCORE06)/bin/pip install --quiet --disable-pip-version-check --no-compile torch==2.13.0 numpy megatron-core==0.6.0
	touch $@

mcore06: $(MCORE06)/.installed

clean:
	rm -rf $(VENV) $(MCORE06) demo-out bench-out
