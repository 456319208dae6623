# Two commands for a fresh machine: `make book` and `make test` (see README.md).
# VENV is overridable (e.g. `make test VENV=/tmp/venvtest`) to try the install from scratch.
VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
# Written after a successful install; newer pyproject/constraints make it stale.
STAMP   := $(VENV)/.installed-batching

.PHONY: venv test book chromium clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q -e '.[model,test,book,bench]' -c constraints.txt
	touch $@

# The book test drives headless Chromium; CI machines start without it.
chromium:
	@command -v chromium >/dev/null 2>&1 || [ -n "$${CHROMIUM:-}" ] || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)

# OpenMP's wait policy is left at libgomp's default (spin briefly, then sleep): PASSIVE
# (sleep at once) makes every parallel region wake its threads and cost cpu-m's batch-2
# decode step ~45 -> ~65 ms here; ACTIVE (spin forever) would steal a core from any
# other process, e.g. a notebook kernel that the test process waits on.
test book: unexport OMP_WAIT_POLICY

test: venv chromium
	$(PY) -m pytest -q

book: venv
	$(PY) tools/build_book.py

clean:
	rm -rf _build .pytest_cache .hypothesis *.egg-info
