# The README's two commands:  make lab   and   make test
# Settings (override on the command line, e.g. `make lab TORCH_INDEX=cu128 PORT=8890`):
PY          ?= python3
VENV        ?= .venv
TORCH       ?= torch==2.13.0
# auto: CPU build unless an NVIDIA GPU is present; or pypi, cpu, cu128, rocm6.4, or an index URL
TORCH_INDEX ?= auto
PORT        ?= 8888
# The edition make lab opens: en, or zh (the Chinese edition, with JupyterLab in Chinese). Default: zh in a Chinese
# locale (LC_ALL, LC_MESSAGES or LANG starting with zh), else en.
LAB_LANG    ?= $(if $(filter zh%,$(or $(LC_ALL),$(LC_MESSAGES),$(LANG))),zh,en)
# make lab's workspace: your copies of the notebooks, a git-ignored folder inside the checkout (one per edition)
WORKSPACE   ?= $(if $(filter zh,$(LAB_LANG)),work-zh,work)
NBVAL_ARGS  ?= --nbval --nbval-current-env --nbval-sanitize-with tests/sanitize.cfg
PYTEST_ARGS ?=
# make test runs on 2 pytest-xdist workers, by groups (tests/conftest.py: a notebook's nbval cells, a file, a
# notebook's browser tests, the cluster tests, the clinic): one worker computes while the other waits on a kernel,
# a browser, a timeout or pip. XDIST= runs in one process.
XDIST       ?= -n 2 --dist loadgroup
# The laptop CPU class that `make test` also checks every notebook under (no AVX-512, no AVX512-BF16/FP16,
# no AMX), whatever CPU runs the tests. docs/authoring.md lists the other classes.
CPU_CAP     ?= ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
CPU_CLASS   ?= avx2
# The class where bf16 is native but fp16 is not (AMD EPYC Zen 4, Cooper Lake): DeepSpeed refuses fp16 there. Its
# browser run covers the notebooks whose outputs depend on the CPU class.
BF16_CAP    ?= ATEN_CPU_CAPABILITY=avx512 ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16
BF16_CLASS  ?= avx512-bf16
BF16_TESTS  ?= -k "04_ or 05_ or 07_ or 10_" tests/browser/test_notebooks.py
# jupyter refuses root without --allow-root; containers and cloud VMs run as root
ALLOW_ROOT  := $(if $(filter 0,$(shell id -u)),--allow-root,)

BIN := $(VENV)/bin
DS_BUILD_DEPS := ninja packaging psutil py-cpuinfo pydantic hjson msgpack einops setuptools wheel
# What `make lab` installs besides labkit's own dependencies: everything a notebook imports (DeepSpeed for
# notebooks 10, 11 and 13; Triton for notebook 08). tests/browser/test_notebooks.py runs every learner copy with
# only these (tests/lab_env.py).
LAB_EXTRAS  := deepspeed,kernels,lowprecision

.PHONY: book lab test test-native test-capped test-capped-bf16 lint gpu-check install install-dev notebooks student doctor clean screenshots test-cluster

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# DeepSpeed is built without its C++ ops (they JIT-compile on first use); it needs torch and its build deps
# present, hence --no-build-isolation. The kernels extra is Triton (notebook 08; Linux only).
$(VENV)/.base: $(BIN)/python pyproject.toml tools/install_torch.py
	$(BIN)/python tools/install_torch.py --spec "$(TORCH)" --index "$(TORCH_INDEX)"
	$(BIN)/python -m pip install -q $(DS_BUILD_DEPS)
	DS_BUILD_OPS=0 $(BIN)/python -m pip install -q --no-build-isolation -e ".[$(LAB_EXTRAS)]"
	touch $@

# The test tools on top (pytest, nbval, playwright, ruff, ...): nothing a notebook imports.
$(VENV)/.dev: $(VENV)/.base
	DS_BUILD_OPS=0 $(BIN)/python -m pip install -q --no-build-isolation -e ".[dev,book,$(LAB_EXTRAS)]"
	touch $@

install: $(VENV)/.base
install-dev: $(VENV)/.dev

# Your workspace, work/ (git-ignored): the notebooks without solutions. The first `make lab` creates it; later
# ones copy in new notebooks and put a changed notebook's new version beside your copy (NN_x.updated.ipynb),
# never over your edits. JupyterLab serves the checkout, so work/'s links reach the reference notebooks/, and
# opens in work/.
# The Chinese UI for this run only: JupyterLab's user settings come from .lab-settings/zh (git-ignored), whose
# translation setting picks the zh_CN language pack; your own JupyterLab settings are not touched.
LAB_UI = $(if $(filter zh,$(LAB_LANG)),JUPYTERLAB_SETTINGS_DIR="$(CURDIR)/.lab-settings/zh",)

lab: $(VENV)/.base
	@if [ -n "$(ALLOW_ROOT)" ]; then echo "make lab: running as root (uid 0), so JupyterLab gets --allow-root"; fi
	@case "$(LAB_LANG)" in en|zh) ;; *) echo "make lab: LAB_LANG must be en or zh, not '$(LAB_LANG)'"; exit 2;; esac
	$(BIN)/python -m labkit workspace --dir $(WORKSPACE) --lang $(LAB_LANG)
	@if [ "$(LAB_LANG)" = zh ]; then $(BIN)/python -m labkit lab-settings --lang zh --dir .lab-settings/zh; fi
	$(LAB_UI) $(BIN)/jupyter lab --no-browser --ip 127.0.0.1 --port $(PORT) --ServerApp.root_dir=. --ContentsManager.preferred_dir=$(WORKSPACE) $(ALLOW_ROOT)

# Lint, everything on this CPU (the Chinese edition in notebooks/zh too), then every English notebook again (strict
# nbval) with the CPU capped to the laptop class,
# and the class-dependent notebooks in the browser capped to the AVX512-BF16 class. A cap only lowers the class:
# where this CPU is not above a cap's class, the native run has already tested that class, and the capped pass
# says so and does not repeat it (tools/cpu_class.py).
test: lint test-native test-capped test-capped-bf16

# The GPU acceptance run (notebooks 03-17 on CUDA + every CUDA-only result -> gpu-report.json/.md); on a
# machine without a CUDA GPU it says so in one line and exits 0.
gpu-check: $(VENV)/.dev
	$(BIN)/python tools/gpu_check.py --out .

# ruff on labkit, the tests, the repo tooling and the notebook sources (rules: pyproject.toml)
lint: $(VENV)/.dev
	$(BIN)/ruff check labkit tests tools

# MPLBACKEND=Agg, as cluster batch jobs export it, must not hide any plot (every imports cell sets
# %matplotlib inline): every run exports it.
test-native: $(VENV)/.dev
	MPLBACKEND=Agg $(BIN)/python -m pytest $(XDIST) tests notebooks $(NBVAL_ARGS) $(PYTEST_ARGS)

# tests/test_cpu_cap.py fails first if the cap does not take effect (torch and DeepSpeed must answer
# "no AVX512-BF16/FP16, no AMX"); LABKIT_EXPECT_CPU_CLASS tells it the highest class to accept.
test-capped: $(VENV)/.dev
	@if $(BIN)/python tools/cpu_class.py --above $(CPU_CLASS); then \
	  env $(CPU_CAP) MPLBACKEND=Agg LABKIT_EXPECT_CPU_CLASS=$(CPU_CLASS) $(BIN)/python -m pytest -p no:cacheprovider $(XDIST) \
	    tests/test_cpu_cap.py::test_this_run_is_the_class_it_claims notebooks --ignore=notebooks/zh $(NBVAL_ARGS) $(PYTEST_ARGS); \
	else echo "test-capped: the native run was already the $(CPU_CLASS) class (or below): not repeated"; fi

test-capped-bf16: $(VENV)/.dev
	@if $(BIN)/python tools/cpu_class.py --above $(BF16_CLASS); then \
	  env $(BF16_CAP) MPLBACKEND=Agg LABKIT_EXPECT_CPU_CLASS=$(BF16_CLASS) $(BIN)/python -m pytest -p no:cacheprovider \
	    tests/test_cpu_cap.py::test_this_run_is_the_class_it_claims $(BF16_TESTS) $(PYTEST_ARGS); \
	else echo "test-capped-bf16: the native run was already the $(BF16_CLASS) class (or below): not repeated"; fi

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
# The static book of both editions, from the stored notebooks, offline (tools/book.py; docs/book.md): _build/book/,
# which any static host serves as it is. BOOK_ARGS="--hub URL --repo URL" fills in the run-it box's class link.
book: $(VENV)/.dev
	$(BIN)/python tools/book.py $(BOOK_ARGS)

student: $(VENV)/.base
	$(BIN)/python -m labkit student-build --tree --out dist/student $(STUDENT_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache  # dist/ (student builds) is left alone
