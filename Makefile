# The README's two commands:  make lab   and   make test
# Settings (override on the command line, e.g. `make lab TORCH_INDEX=cu128 PORT=8890`):
PY          ?= python3
VENV        ?= .venv
TORCH       ?= torch==2.13.0
# auto: CPU build unless an NVIDIA GPU is present; or pypi, cpu, cu128, rocm6.4, or an index URL
TORCH_INDEX ?= auto
PORT        ?= 8888
NBVAL_ARGS  ?= --nbval --nbval-current-env --nbval-sanitize-with tests/sanitize.cfg
PYTEST_ARGS ?=

BIN := $(VENV)/bin
DS_BUILD_DEPS := ninja packaging psutil py-cpuinfo pydantic hjson msgpack einops setuptools wheel

.PHONY: lab test install install-dev notebooks student doctor clean screenshots

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.base: $(BIN)/python pyproject.toml tools/install_torch.py
	$(BIN)/python tools/install_torch.py --spec "$(TORCH)" --index "$(TORCH_INDEX)"
	$(BIN)/python -m pip install -q -e .
	touch $@

# DeepSpeed is built without its C++ ops (they JIT-compile on first use); it needs its build deps present.
$(VENV)/.dev: $(VENV)/.base
	$(BIN)/python -m pip install -q $(DS_BUILD_DEPS)
	DS_BUILD_OPS=0 $(BIN)/python -m pip install -q --no-build-isolation -e ".[dev,deepspeed]"
	touch $@

install: $(VENV)/.base
install-dev: $(VENV)/.dev

lab: $(VENV)/.base
	$(BIN)/jupyter lab --no-browser --ip 127.0.0.1 --port $(PORT) --ServerApp.root_dir=notebooks

test: $(VENV)/.dev
	$(BIN)/python -m pytest tests notebooks $(NBVAL_ARGS) $(PYTEST_ARGS)

# Regenerate the README's screenshots (docs/img/*.png) from the notebooks running in headless Chromium.
screenshots: $(VENV)/.dev
	$(BIN)/python -m pytest tests/browser/screenshots.py -q -p no:cacheprovider

doctor: $(VENV)/.base
	$(BIN)/python -m labkit doctor

# Rebuild every notebook from tools/nbsrc and store it executed.
notebooks: $(VENV)/.dev
	$(BIN)/python tools/nbbuild.py

# Student copies of the notebooks, solutions removed: dist/student/
student: $(VENV)/.base
	$(BIN)/python -m labkit student-build --src notebooks --out dist/student

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
