# One-command workflows. `make demo` and `make test` each set everything up from scratch:
# a virtualenv in .venv, the local CPU build of torch 2.13.0, and this package.
# `make test-torch214` runs the same suite in a second virtualenv, .venv-214, kept apart from .venv:
# torch 2.14.1 + torchvision 0.29.1, the newest pair this machine's package setup installs from disk
# (a CUDA build, about 5.5 GB, run on the CPU), so the suite also runs on the torch users have.
# Both run the suite without the tests marked slow (pyproject's addopts, -m 'not slow'): torchrun
# launches, whole parallelism searches, the comparisons with torch's allocator and the other long checks,
# which would take `make test` past 5 minutes on 2 cores. `make test-slow` and `make test-torch214-slow`
# run exactly those (-m slow); .ci/run runs all four.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP_IN = $(1)/bin/python -m pip install -q --disable-pip-version-check
PIP := $(call PIP_IN,$(VENV))
VENV214 ?= .venv-214
TORCH214 := torch==2.14.1 torchvision==0.29.1
APT := DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null

.PHONY: demo test test-slow test-torch214 test-torch214-slow bench clean

$(VENV)/.base: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) torch==2.13.0
	$(PIP) -e .
	touch $@

# the HTML report's browser test runs Debian's chromium, installed here when apt-get can
$(VENV)/.test: $(VENV)/.base
	$(PIP) -e ".[test]"
	@command -v chromium >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
	  { $(APT) || { apt-get update -q >/dev/null && $(APT); }; }; } || \
	  echo "warning: chromium could not be installed (apt-get as root): the browser test will be skipped"
	touch $@

# the pair is pinned in the same resolve as the package so that its dependencies cannot move torch;
# the check after it fails the build if anything did
$(VENV214)/.test: pyproject.toml
	python3 -m venv $(VENV214)
	$(call PIP_IN,$(VENV214)) -e ".[test]" $(TORCH214)
	$(VENV214)/bin/python -c "import torch, torchvision; v = torch.__version__, torchvision.__version__; \
	  assert v[0].startswith('2.14.1') and v[1].startswith('0.29.1'), v"
	touch $@

demo: $(VENV)/.base
	$(VENV)/bin/layerscope summary layerscope.examples:small_cnn \
		--columns input_shape,output_shape,params,kernel,macs,flops,receptive_field
	$(VENV)/bin/layerscope summary layerscope.examples:tiny_gpt --depth 2 --backward \
		--columns output_shape,params,macs,flops,backward_macs

test: $(VENV)/.test
	$(PY) -m pytest -q

# the tests `make test` leaves out (the command line's -m comes after addopts' and wins)
test-slow: $(VENV)/.test
	$(PY) -m pytest -q -m slow

# the browser test uses the chromium `make test` installs; run alone, without it, that test is skipped
test-torch214: $(VENV214)/.test
	$(VENV214)/bin/python -m pytest -q

test-torch214-slow: $(VENV214)/.test
	$(VENV214)/bin/python -m pytest -q -m slow

bench: $(VENV)/.test
	$(PY) bench/bench_analyze.py
	$(PY) bench/bench_memory.py
	$(PY) bench/bench_latency.py
	$(PY) bench/bench_exported.py

clean:
	rm -rf $(VENV) $(VENV214) build src/*.egg-info .pytest_cache
