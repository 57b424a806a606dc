# The README's two commands:  make lab   and   make test
# Settings (override on the command line, e.g. `make lab TORCH_INDEX=cu128 PORT=8890`):
PY          ?= python3
VENV        ?= .venv
TORCH       ?= torch==2.13.0
# auto: CPU build unless an NVIDIA GPU is present; or pypi, cpu, cu128, rocm6.4, or an index URL
TORCH_INDEX ?= auto
PORT        ?= 8888
# make lab's workspace: your copies of the notebooks, a git-ignored folder inside the checkout
WORKSPACE   ?= work
NBVAL_ARGS  ?= --nbval --nbval-current-env --nbval-sanitize-with tests/sanitize.cfg
PYTEST_ARGS ?=
# The laptop CPU class that `make test` also checks every notebook under (no AVX-512, no AVX512-BF16/FP16,
# no AMX), whatever CPU runs the tests. docs/authoring.md lists the other classes.
CPU_CAP     ?= ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
CPU_CLASS   ?= avx2
# jupyter refuses root without --allow-root; containers and cloud VMs run as root
ALLOW_ROOT  := $(if $(filter 0,$(shell id -u)),--allow-root,)

BIN := $(VENV)/bin
DS_BUILD_DEPS := ninja packaging psutil py-cpuinfo pydantic hjson msgpack einops setuptools wheel

.PHONY: lab test test-native test-capped lint gpu-check install install-dev notebooks student doctor clean screenshots test-cluster

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.base: $(BIN)/python pyproject.toml tools/install_torch.py
	$(BIN)/python tools/install_torch.py --spec "$(TORCH)" --index "$(TORCH_INDEX)"
	$(BIN)/python -m pip install -q -e ".[kernels]"
	touch $@

# DeepSpeed is built without its C++ ops (they JIT-compile on first use); it needs its build deps present.
# The kernels extra is Triton (notebook 08; Linux only, installed with the base too); it has no dependencies,
# so the pinned torch stays.
$(VENV)/.dev: $(VENV)/.base
	$(BIN)/python -m pip install -q $(DS_BUILD_DEPS)
	DS_BUILD_OPS=0 $(BIN)/python -m pip install -q --no-build-isolation -e ".[dev,deepspeed,kernels]"
	touch $@

install: $(VENV)/.base
install-dev: $(VENV)/.dev

# Your workspace, work/ (git-ignored): the notebooks without solutions. The first `make lab` creates it; later
# ones copy in new notebooks and put a changed notebook's new version beside your copy (NN_x.updated.ipynb),
# never over your edits. JupyterLab serves the checkout, so work/'s links reach the reference notebooks/, and
# opens in work/.
lab: $(VENV)/.base
	@if [ -n "$(ALLOW_ROOT)" ]; then echo "make lab: running as root (uid 0), so JupyterLab gets --allow-root"; fi
	$(BIN)/python -m labkit workspace --dir $(WORKSPACE)
	$(BIN)/jupyter lab --no-browser --ip 127.0.0.1 --port $(PORT) --ServerApp.root_dir=. --ContentsManager.preferred_dir=$(WORKSPACE) $(ALLOW_ROOT)

# Lint, everything on this CPU, then every notebook again (strict nbval) with the CPU capped to the laptop class.
test: lint test-native test-capped

# The GPU acceptance run (notebooks 03-10 on CUDA + every CUDA-only result -> gpu-report.json/.md); on a
# machine without a CUDA GPU it says so in one line and exits 0.
gpu-check: $(VENV)/.dev
	$(BIN)/python tools/gpu_check.py --out .

# ruff on labkit, the tests, the repo tooling and the notebook sources (rules: pyproject.toml)
lint: $(VENV)/.dev
	$(BIN)/ruff check labkit tests tools

test-native: $(VENV)/.dev
	$(BIN)/python -m pytest tests notebooks $(NBVAL_ARGS) $(PYTEST_ARGS)

# tests/test_cpu_cap.py fails first if the cap does not take effect (torch and DeepSpeed must answer
# "no AVX512-BF16/FP16, no AMX"); LABKIT_EXPECT_CPU_CLASS tells it the highest class to accept. MPLBACKEND=Agg,
# as cluster batch jobs export it, must not hide any plot (every imports cell sets %matplotlib inline).
test-capped: $(VENV)/.dev
	env $(CPU_CAP) MPLBACKEND=Agg LABKIT_EXPECT_CPU_CLASS=$(CPU_CLASS) $(BIN)/python -m pytest -p no:cacheprovider \
	    tests/test_cpu_cap.py::test_this_run_is_the_class_it_claims notebooks $(NBVAL_ARGS) $(PYTEST_ARGS)

# The cluster tests alone (test-native runs them too): a login host and two compute nodes in network namespaces,
# multi-node DDP/DeepSpeed, the ssh tunnel, JupyterHub + SlurmSpawner. Root only; tests/cluster/conftest.py says what.
test-cluster: $(VENV)/.dev
	$(BIN)/python -m pytest tests/cluster -q $(PYTEST_ARGS)

# Regenerate the README's screenshots (docs/img/*.png) from the notebooks running in headless Chromium.
screenshots: $(VENV)/.dev
	$(BIN)/python -m pytest tests/browser/screenshots.py -q -p no:cacheprovider

doctor: $(VENV)/.base
	$(BIN)/python -m labkit doctor

# Rebuild every notebook from tools/nbsrc and store it executed.
notebooks: $(VENV)/.dev
	$(BIN)/python tools/nbbuild.py

# The students' copy of the workbook, no solutions: dist/student/ (README, notebooks/, slurm/; no labkit/, tools/,
# tests/). It replaces only an earlier build; STUDENT_ARGS=--force moves any other dist/student aside, deleting nothing.
student: $(VENV)/.base
	$(BIN)/python -m labkit student-build --tree --out dist/student $(STUDENT_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache  # dist/ (student builds) is left alone
