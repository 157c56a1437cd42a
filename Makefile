# One-command workflows. `make demo` and `make test` each set everything up from scratch:
# a virtualenv in .venv, the local CPU build of torch 2.13.0, and this package.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q --disable-pip-version-check
APT := DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null

.PHONY: demo test bench clean

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

demo: $(VENV)/.base
	$(VENV)/bin/layerscope summary layerscope.examples:small_cnn \
		--columns input_shape,output_shape,params,kernel,macs,flops,receptive_field
	$(VENV)/bin/layerscope summary layerscope.examples:tiny_gpt --depth 2 --backward \
		--columns output_shape,params,macs,flops,backward_macs

test: $(VENV)/.test
	$(PY) -m pytest -q

bench: $(VENV)/.test
	$(PY) bench/bench_analyze.py
	$(PY) bench/bench_memory.py
	$(PY) bench/bench_latency.py
	$(PY) bench/bench_exported.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
