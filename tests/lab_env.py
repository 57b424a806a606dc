"""The environment that `make lab` alone creates, reproduced inside the test environment.

`make test` installs the test tools (pytest, nbval, playwright, ...) on top of what `make lab` installs, so a
notebook that imports something only the tests install would pass every test and fail for a learner. This
module computes what `make lab` installs (labkit's requirements with the Makefile's ``LAB_EXTRAS``, DeepSpeed's
build dependencies, and everything they require, from the installed packages' own metadata) and writes a
``sitecustomize`` that makes every other installed distribution's modules unimportable: ``ModuleNotFoundError``,
as in a venv that lacks them. Put :func:`blocker_env`'s ``PYTHONPATH`` on a kernel and every process it starts
(torchrun, its ranks, the clinic's runs) inherits it.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import json
import sys
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
# What any venv holds before `make lab` installs anything (the Makefile upgrades pip in it).
BOOTSTRAP = {"pip", "setuptools", "wheel"}

SITECUSTOMIZE = '''\
"""Written by tests/lab_env.py: packages that `make lab` does not install are not found, as in its venv."""
import importlib.machinery, json, os, re, sys

class _OnlyWhatMakeLabInstalls:
    """sys.meta_path's PathFinder, blind to the blocked top-level modules: find_spec answers None, import raises
    ModuleNotFoundError, exactly as where the package is absent."""
    blocked = frozenset(json.loads(os.environ.get("LABKIT_LAB_ENV_BLOCKED", "[]")))
    allowed = frozenset(json.loads(os.environ.get("LABKIT_LAB_ENV_ALLOWED", "[]")))

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.partition(".")[0] in cls.blocked:
            return None
        return importlib.machinery.PathFinder.find_spec(name, path, target)

    @classmethod
    def find_distributions(cls, *args, **kwargs):  # importlib.metadata: versions, entry points
        canon = lambda n: re.sub(r"[-_.]+", "-", n).lower()
        return (d for d in importlib.machinery.PathFinder.find_distributions(*args, **kwargs)
                if canon(d.metadata["Name"] or "") in cls.allowed)

    @classmethod
    def invalidate_caches(cls):
        importlib.machinery.PathFinder.invalidate_caches()

sys.meta_path[:] = [_OnlyWhatMakeLabInstalls if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
'''


def _cuda_install_tool():
    """tools/cuda_install.py as a module (tools/ is not a package): the one reader of the Makefile's settings."""
    spec = importlib.util.spec_from_file_location("labkit_tool_cuda_install", ROOT / "tools" / "cuda_install.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


makefile_var = _cuda_install_tool().makefile_var


def lab_requirements() -> list[Requirement]:
    """What `make lab` asks pip for: labkit with LAB_EXTRAS, and DeepSpeed's build dependencies."""
    extras = [e.strip() for e in makefile_var("LAB_EXTRAS").split(",") if e.strip()]
    reqs = [Requirement(f"labkit[{','.join(extras)}]")]
    reqs += [Requirement(name) for name in makefile_var("DS_BUILD_DEPS").split()]
    return reqs


def _environment(extra: str = "") -> dict[str, str]:
    return {**default_environment(), "extra": extra}


def installed_closure(reqs: list[Requirement]) -> set[str]:
    """Canonical names of the installed distributions that ``reqs`` need, transitively (markers evaluated)."""
    seen: set[str] = set()
    todo: list[tuple[str, frozenset[str]]] = [(r.name, frozenset(r.extras)) for r in reqs]
    done: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, extras = todo.pop()
        key = (canonicalize_name(name), extras)
        if key in done:
            continue
        done.add(key)
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue  # an optional dependency that is not installed here: nothing of it can be imported anyway
        seen.add(canonicalize_name(dist.metadata["Name"]))
        for line in dist.requires or []:
            req = Requirement(line)
            wanted = [""] + sorted(extras)
            if req.marker is not None and not any(req.marker.evaluate(_environment(e)) for e in wanted):
                continue
            todo.append((req.name, frozenset(req.extras)))
    return seen


def allowed_distributions() -> set[str]:
    """Canonical names of the distributions a venv made by `make lab` holds."""
    return installed_closure(lab_requirements()) | BOOTSTRAP


def blocked_modules() -> list[str]:
    """Top-level modules that only distributions outside `make lab`'s install provide."""
    allowed = allowed_distributions()
    providers: dict[str, set[str]] = {}
    for module, dists in md.packages_distributions().items():
        providers.setdefault(module, set()).update(canonicalize_name(d) for d in dists)
    stdlib = set(sys.stdlib_module_names)
    return sorted(m for m, dists in providers.items()
                  if m not in stdlib and not m.startswith("_distutils") and not dists & allowed)


def blocker_env(folder: Path, base: dict[str, str]) -> dict[str, str]:
    """``base`` plus a PYTHONPATH whose ``sitecustomize`` blocks :func:`blocked_modules` in every child process."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = dict(base)
    env["PYTHONPATH"] = str(folder) + (":" + base["PYTHONPATH"] if base.get("PYTHONPATH") else "")
    env["LABKIT_LAB_ENV_BLOCKED"] = json.dumps(blocked_modules())
    env["LABKIT_LAB_ENV_ALLOWED"] = json.dumps(sorted(allowed_distributions()))
    return env
