"""Drive a private JupyterLab server with headless Chromium through Playwright (used by conftest.py).

One JupyterLab server and one browser serve the whole session:

* the server listens on 127.0.0.1 on a free port, requires a random token, and serves a temporary copy
  of ``notebooks/``; HOME, every Jupyter/IPython/matplotlib directory and the XDG dirs point into a
  temporary directory, so nothing is written to the real home;
* Chromium is Debian's ``/usr/bin/chromium`` (``LABKIT_CHROMIUM`` overrides it), launched headless with
  the flags from ``/work/shared/field-notes.md``;
* ``lab.run_notebook(name)`` opens a notebook, waits for ``Python 3 (ipykernel) | Idle``, clears it,
  runs all cells and waits until every code cell has an execution count. The result is cached until a
  different notebook is requested, so the widget tests for a notebook reuse its run (test items are
  ordered by notebook to make that work, see ``pytest_collection_modifyitems``).

On a failure, a screenshot of the page, the browser console and the server log are written to
``build/browser-artifacts/`` (``LABKIT_BROWSER_ARTIFACTS`` overrides it) and their paths are added to the
test report. Without Playwright or Chromium the tests skip, and in CI (``CI=true``) the top-level
conftest turns those skips into failures.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
#: The notebooks under test; LABKIT_BROWSER_NOTEBOOKS points the tests at another folder (development).
NOTEBOOKS = Path(os.environ.get("LABKIT_BROWSER_NOTEBOOKS", REPO / "notebooks"))
BROWSER_DIR = Path(__file__).resolve().parent
CHROMIUM = os.environ.get("LABKIT_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: Playwright's default timeout for locators and ``expect`` (ms).
EXPECT_TIMEOUT_MS = 60_000
#: How long Run All may take for one notebook (s); notebooks must run in < 60 s on 2 cores.
RUN_TIMEOUT_S = float(os.environ.get("LABKIT_BROWSER_RUN_TIMEOUT", "600"))
ARTIFACTS = Path(os.environ.get("LABKIT_BROWSER_ARTIFACTS", REPO / "build" / "browser-artifacts"))
KERNEL_IDLE = "Python 3 (ipykernel) | Idle"
STDERR_MIME = "application/vnd.jupyter.stderr"
IMAGE_MIMES = ("image/png", "image/svg+xml", "image/jpeg")

#: JupyterLab user settings written into the private settings dir: no autosave (the temp copy stays
#: as stored), every cell attached to the DOM (so off-screen outputs can be inspected), no news toast.
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
}


def notebook_names() -> list[str]:
    """The workbook's notebooks (file names), found by listing notebooks/ at collection time."""
    return sorted(p.name for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def notebook_by_number(number: str) -> str | None:
    """The file name of notebook ``NN_*.ipynb``, or None when it has not landed yet."""
    hits = [n for n in notebook_names() if n.startswith(f"{number}_")]
    return hits[0] if hits else None


def stored_cells(name: str, root: Path = NOTEBOOKS) -> list[dict[str, Any]]:
    """The cells of a stored .ipynb as plain JSON dicts."""
    return json.loads((root / name).read_text())["cells"]


_IGNORED = shutil.ignore_patterns(".git", ".venv", "build", "dist", "runs", "*.egg-info", "__pycache__",
                                  ".pytest_cache", ".ruff_cache", ".hypothesis", ".ipynb_checkpoints", "_out")


def mirror_worktree(dest: Path) -> Path:
    """Copy the checkout (git's tracked + untracked, unignored files) to ``dest``; return dest/notebooks.

    Notebooks may read files next to notebooks/ (notebook 12 reads slurm/), so the server root is a copy
    of notebooks/ inside a copy of the checkout, not a lone folder. ``NOTEBOOKS`` replaces notebooks/.
    """
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                cwd=REPO, capture_output=True, check=True, timeout=60).stdout
        files: list[str] | None = [f for f in listed.decode().split("\0") if f]
    except (OSError, subprocess.SubprocessError):
        files = None
    if files is None:
        shutil.copytree(REPO, dest, ignore=_IGNORED, symlinks=True, dirs_exist_ok=True)
    else:
        for rel in files:
            src = REPO / rel
            if src.is_file() and not src.is_symlink():
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / rel)
    root = dest / "notebooks"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(NOTEBOOKS, root, ignore=_IGNORED)
    return root


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def private_env(home: Path) -> dict[str, str]:
    """The environment for the server and its kernels: every config/data/cache dir under ``home``."""
    env = dict(os.environ)
    dirs = {
        "HOME": home,
        "JUPYTER_CONFIG_DIR": home / "jupyter" / "config",
        "JUPYTER_DATA_DIR": home / "jupyter" / "data",
        "JUPYTER_RUNTIME_DIR": home / "jupyter" / "runtime",
        "JUPYTERLAB_SETTINGS_DIR": home / "jupyter" / "lab" / "user-settings",
        "JUPYTERLAB_WORKSPACES_DIR": home / "jupyter" / "lab" / "workspaces",
        "IPYTHONDIR": home / "ipython",
        "MPLCONFIGDIR": home / "matplotlib",
        "XDG_CONFIG_HOME": home / "xdg" / "config",
        "XDG_CACHE_HOME": home / "xdg" / "cache",
        "XDG_DATA_HOME": home / "xdg" / "data",
        "XDG_RUNTIME_DIR": home / "xdg" / "runtime",
    }
    for key, path in dirs.items():
        path.mkdir(parents=True, exist_ok=True)
        env[key] = str(path)
    (home / "xdg" / "runtime").chmod(0o700)
    # DeepSpeed's JIT-built ops: a cache set by the caller is kept, else one in the ignored build/ dir
    # is reused across runs (a cold build costs minutes); never the real home's cache.
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / "build" / "torch_extensions"))
    env.pop("JUPYTER_TOKEN", None)
    env.pop("JUPYTER_PATH", None)
    env["JUPYTER_PLATFORM_DIRS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def write_lab_settings(settings_dir: Path) -> None:
    """Write ``LAB_SETTINGS`` as JupyterLab user settings files."""
    for plugin, values in LAB_SETTINGS.items():
        path = settings_dir / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


@dataclass
class HttpReply:
    """Status, headers and body of one HTTP request to the server."""

    status: int
    headers: dict[str, str]
    body: str


@dataclass
class LabServer:
    """A running ``jupyter lab`` process bound to 127.0.0.1 with a token."""

    proc: subprocess.Popen[bytes]
    port: int
    token: str
    root: Path
    log_path: Path
    env: dict[str, str]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(cls, root: Path, home: Path, log_path: Path, timeout_s: float = 90.0,
              extra_env: dict[str, str] | None = None) -> LabServer:
        """Start JupyterLab serving ``root`` and wait until its API answers; ``extra_env`` reaches its kernels."""
        env = {**private_env(home), **(extra_env or {})}
        write_lab_settings(Path(env["JUPYTERLAB_SETTINGS_DIR"]))
        token = secrets.token_hex(24)
        last_error = ""
        for _attempt in range(3):  # a free port can be taken between free_port() and bind()
            port = free_port()
            cmd = [
                sys.executable, "-m", "jupyterlab", "--no-browser",
                "--ip", "127.0.0.1", "--port", str(port), "--port-retries", "0",
                f"--IdentityProvider.token={token}",
                f"--ServerApp.root_dir={root}",
                "--LabApp.expose_app_in_browser=True",
                "--LabApp.news_url=",
                "--ServerApp.open_browser=False",
            ]
            if hasattr(os, "geteuid") and os.geteuid() == 0:
                cmd.append("--allow-root")
            log = log_path.open("ab")
            proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            log.close()
            server = cls(proc=proc, port=port, token=token, root=root, log_path=log_path, env=env)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    if server.request("/api/status").status == 200:
                        return server
                except OSError as exc:
                    last_error = str(exc)
                time.sleep(0.25)
            server.stop()
            last_error = f"exit code {proc.returncode}; {last_error}"
        raise RuntimeError(f"JupyterLab did not start ({last_error}); log: {log_path}\n"
                           + log_path.read_text(errors="replace")[-3000:])

    def request(self, path: str, method: str = "GET", with_token: bool = True) -> HttpReply:
        """One HTTP request to the server (redirects are not followed)."""
        headers = {"Authorization": f"token {self.token}"} if with_token else {}
        req = urllib.request.Request(self.base_url + path, method=method, headers=headers)
        opener = urllib.request.build_opener(_NoRedirect)
        try:
            with opener.open(req, timeout=10) as resp:
                return HttpReply(resp.status, dict(resp.headers), resp.read().decode(errors="replace"))
        except urllib.error.HTTPError as err:
            return HttpReply(err.code, dict(err.headers), err.read().decode(errors="replace"))

    def shutdown_sessions(self) -> None:
        """Shut down every kernel session on the server (frees the kernels between notebooks)."""
        reply = self.request("/api/sessions")
        if reply.status != 200:
            return
        for session in json.loads(reply.body):
            self.request(f"/api/sessions/{session['id']}", method="DELETE")

    def stop(self) -> None:
        """Stop the server and its kernels (the whole process group), politely first."""
        if self.proc.poll() is None:
            try:
                self.shutdown_sessions()
            except OSError:
                pass
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=15)


# JavaScript run in the page: the state of the notebook panel showing `path`.
_STATE_JS = r"""
([path, full]) => {
  const app = window.jupyterapp;
  if (!app) return null;
  const panels = Array.from(app.shell.widgets('main'));
  const panel = panels.find(w => w.context && w.context.path === path);
  if (!panel || !panel.content) return null;
  const kernel = panel.sessionContext.session ? panel.sessionContext.session.kernel : null;
  const clip = (t) => (Array.isArray(t) ? t.join('') : String(t)).slice(0, 4000);
  // Outputs without image payloads (they are large); image mime keys are kept.
  const summarize = (o) => {
    const s = { output_type: o.output_type };
    if (o.name !== undefined) s.name = o.name;
    if (o.text !== undefined) s.text = clip(o.text);
    if (o.ename !== undefined) { s.ename = o.ename; s.evalue = clip(o.evalue); }
    if (o.data) {
      s.data = {};
      for (const k of Object.keys(o.data)) s.data[k] = k.startsWith('image/') ? '<image>' : clip(
        typeof o.data[k] === 'string' || Array.isArray(o.data[k]) ? o.data[k] : JSON.stringify(o.data[k]));
    }
    return s;
  };
  const cells = panel.content.widgets.map((cell, index) => {
    const m = cell.model;
    const source = m.sharedModel.getSource();
    const out = { index, type: m.type, source: full ? source : '', blank: !source.trim(),
                  tags: m.getMetadata('tags') || [] };
    if (m.type === 'code') {
      out.executionCount = m.executionCount;
      out.prompt = cell.promptNode ? cell.promptNode.textContent : '';
      const outputs = m.outputs.toJSON();
      out.outputs = full ? outputs.map(summarize)
                         : outputs.filter(o => o.output_type === 'error').map(summarize);
      out.stderrNodes = cell.node.querySelectorAll(
        '[data-mime-type="application/vnd.jupyter.stderr"]').length;
      out.images = !full ? [] : Array.from(cell.node.querySelectorAll(
          '.jp-RenderedImage img, .jp-RenderedSVG svg, .jp-RenderedSVG img'))
        .map(el => el.tagName.toLowerCase() === 'img'
             ? { tag: 'img', complete: el.complete, width: el.naturalWidth, height: el.naturalHeight }
             : { tag: 'svg', complete: true, width: el.getBoundingClientRect().width,
                 height: el.getBoundingClientRect().height });
    }
    return out;
  });
  return { kernelStatus: kernel ? kernel.status : null,
           kernelName: kernel ? kernel.name : null, cells };
}
"""


#: Close every document in the main area without saving (a Run All leaves its notebook modified; nothing is saved).
_CLOSE_ALL_JS = r"""
() => {
  for (const w of Array.from(window.jupyterapp.shell.widgets('main'))) {
    if (w.context) w.context.model.dirty = false;
    w.dispose();
  }
  return Array.from(window.jupyterapp.shell.widgets('main')).length;
}
"""

#: True once the notebook at path is open, its model loaded and its kernel connected and idle.
_KERNEL_IDLE_JS = r"""
(path) => {
  const w = Array.from(window.jupyterapp.shell.widgets('main')).find(w => w.context && w.context.path === path);
  const kernel = w && w.context.isReady && w.sessionContext.session ? w.sessionContext.session.kernel : null;
  return !!kernel && kernel.status === 'idle' && kernel.connectionStatus === 'connected';
}
"""


#: The URL `make lab` prints once JupyterLab is up.
MAKE_LAB_URL = re.compile(r"http://127\.0\.0\.1:(\d+)/lab\?token=([0-9a-f]+)")


def fresh_checkout(base: Path) -> tuple[Path, dict[str, str]]:
    """A copy of the checkout under ``base`` and a learner's environment for `make lab` there: a private HOME, no
    LABKIT_PROGRESS or LABKIT_LANG (the progress record and the language are what make lab sets up), and
    XDG_STATE_HOME inside that HOME."""
    root = mirror_worktree(base / "checkout").parent
    home = base / "home"
    env = private_env(home)
    env.pop("LABKIT_PROGRESS", None)
    env.pop("LABKIT_LANG", None)
    env["XDG_STATE_HOME"] = str(home / "xdg" / "state")
    return root, env


def start_make_lab(root: Path, env: dict[str, str], log_path: Path, make_args: list[str],
                   timeout_s: float = 120.0) -> LabServer:
    """Run `make lab` (with ``make_args``, the test's .venv and a free port) in the checkout ``root`` until its
    JupyterLab prints its URL and answers; return the server (``stop()`` ends the whole process group).
    The tests read the page through window.jupyterapp, which a private config exposes (not make lab's flags)."""
    lab_config = {"LabApp": {"expose_app_in_browser": True, "news_url": ""}}
    for name in ("jupyter_lab_config.json", "jupyter_server_config.json"):
        (Path(env["JUPYTER_CONFIG_DIR"]) / name).write_text(json.dumps(lab_config))
    venv = Path(sys.prefix)
    cmd = ["make", "lab", *make_args, f"VENV={venv}", f"PORT={free_port()}", "-o", f"{venv}/.base"]
    with log_path.open("ab") as log:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        found = MAKE_LAB_URL.search(log_path.read_text(errors="replace"))
        if found:
            server = LabServer(proc=proc, port=int(found[1]), token=found[2], root=root, log_path=log_path, env=env)
            if server.request("/api/status").status == 200:
                return server
        time.sleep(0.25)
    if proc.poll() is None:
        LabServer(proc=proc, port=0, token="", root=root, log_path=log_path, env=env).stop()
    raise AssertionError(f"make lab {' '.join(make_args)} did not start JupyterLab (exit {proc.poll()}):\n"
                         + log_path.read_text(errors="replace")[-3000:])


def error_outputs(cell: dict[str, Any]) -> list[str]:
    """Describe the error and stderr outputs of one code cell (model outputs and rendered DOM)."""
    found = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            found.append(f"{out.get('ename')}: {out.get('evalue')}")
        elif out.get("output_type") == "stream" and out.get("name") == "stderr":
            found.append("stderr: " + "".join(out.get("text", ""))[:500])
        elif STDERR_MIME in out.get("data", {}):
            found.append("stderr mime: " + str(out["data"][STDERR_MIME])[:500])
    if cell.get("stderrNodes") and not found:
        found.append(f"{cell['stderrNodes']} rendered stderr output(s) (inside a widget?)")
    return found


@dataclass
class NotebookRun:
    """A notebook opened in the browser and run top to bottom."""

    name: str
    page: Any
    state: dict[str, Any]
    seconds: float
    open_seconds: float = 0.0
    console: list[str] = field(default_factory=list)

    def cell(self, index: int) -> Any:
        """The Playwright locator of cell ``index`` (0-based, counting markdown cells)."""
        return self.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell").nth(index)

    def code_cell_with(self, text: str) -> Any:
        """The locator of the first code cell whose source contains ``text``."""
        for c in self.state["cells"]:
            if c["type"] == "code" and text in c["source"]:
                return self.cell(c["index"])
        raise LookupError(f"{self.name}: no code cell contains {text!r}")

    def refresh(self, full: bool = True) -> dict[str, Any]:
        """Re-read the notebook's state from the page (``full=False``: counts and errors only, cheap)."""
        state = self.page.evaluate(_STATE_JS, [self.name, full])
        if full:
            self.state = state
        return state


@dataclass
class Lab:
    """The session's JupyterLab server plus browser; opens and runs notebooks."""

    server: LabServer
    browser: Any
    current: NotebookRun | None = None
    #: What the status bar says of an idle kernel, in the UI's language (the Chinese UI: "... | 空闲").
    kernel_idle: str = KERNEL_IDLE
    pages: list[Any] = field(default_factory=list)
    _runs: dict[str, NotebookRun] = field(default_factory=dict)
    _failed: dict[str, BaseException] = field(default_factory=dict)
    #: The page of the last Run All: the next Run All opens its notebook in the same JupyterLab, as a learner
    #: does, instead of loading the whole application again (about 5 s of a 2-core machine per notebook).
    _app: Any = None

    def new_page(self, with_token: bool = True) -> Any:
        """A page in a fresh browser context (no cookies), tracked for failure screenshots."""
        context = self.browser.new_context(viewport={"width": 1400, "height": 1000})
        context.set_default_timeout(EXPECT_TIMEOUT_MS)
        page = context.new_page()
        console: list[str] = []
        page.on("console", lambda msg: console.append(f"[{msg.type}] {msg.text}"))
        page.on("pageerror", lambda exc: console.append(f"[pageerror] {exc}"))
        page._labkit_console = console  # type: ignore[attr-defined]
        self.pages.append(page)
        return page

    def close_pages(self, keep: Any = None) -> None:
        """Close every open page but ``keep`` and shut down all kernels."""
        for page in self.pages:
            if page is not keep:
                with contextlib.suppress(Exception):  # a crashed page must not stop the cleanup
                    page.context.close()
        self.pages[:] = [keep] if keep is not None and keep in self.pages else []
        if keep is None:
            self._app = None
        self.current = None
        self.server.shutdown_sessions()

    def _reopen(self, name: str) -> Any:
        """Open ``name`` in the last Run All's JupyterLab page after closing its notebooks (their kernels are shut
        down); None where that page is gone or does not answer (the caller opens a fresh page)."""
        page = self._app
        self._app = None
        if page is None or page not in self.pages or page.is_closed():
            return None
        try:
            page.evaluate(_CLOSE_ALL_JS)
            self.close_pages(keep=page)
            page._labkit_console.clear()  # type: ignore[attr-defined]  # this notebook's messages only
            page.evaluate("(p) => window.jupyterapp.commands.execute('docmanager:open', "
                          "{path: p, factory: 'Notebook'}).then(() => true)", name)
            page.wait_for_function(_KERNEL_IDLE_JS, arg=name)
            page.locator("#jp-main-statusbar").get_by_text(self.kernel_idle, exact=False).first.wait_for(
                state="visible")
        except Exception:  # any failure here means: start from a fresh page
            self.close_pages()
            return None
        return page

    def open_notebook(self, name: str) -> Any:
        """Open ``name`` in a fresh page and wait until its kernel reports idle in the status bar."""
        if not (self.server.root / name).is_file():
            raise FileNotFoundError(f"{name} is not in the server root {self.server.root}")
        page = self.new_page()
        page.goto(f"{self.server.base_url}/lab/tree/{name}?reset&token={self.server.token}")
        page.wait_for_function("(p) => window.jupyterapp && window.jupyterapp.shell && "
                               "Array.from(window.jupyterapp.shell.widgets('main'))"
                               ".some(w => w.context && w.context.path === p)", arg=name)
        status = page.locator("#jp-main-statusbar").get_by_text(self.kernel_idle, exact=False)
        status.first.wait_for(state="visible")
        return page

    def run_notebook(self, name: str) -> NotebookRun:
        """Open ``name``, clear it, Run All and wait for every code cell's execution count (cached)."""
        if name in self._failed:
            raise AssertionError(f"{name}: the earlier Run All of this session failed") from self._failed[name]
        cached = self._runs.get(name)
        if cached is not None and self.current is cached:
            return cached
        self._runs.clear()
        self._failed.clear()
        try:
            run = self._run(name)
        except BaseException as exc:
            self._failed[name] = exc
            raise
        self._runs[name] = run
        self.current = run
        return run

    def _run(self, name: str) -> NotebookRun:
        t_open = time.monotonic()
        page = self._reopen(name)
        if page is None:
            self.close_pages()
            page = self.open_notebook(name)
        self._app = page
        t0 = time.monotonic()
        page.evaluate("() => window.jupyterapp.commands.execute('notebook:clear-all-cell-outputs')")
        state = page.evaluate(_STATE_JS, [name, True])
        stale = [c["index"] for c in state["cells"] if c["type"] == "code" and c["executionCount"]]
        assert not stale, f"{name}: cells {stale} kept their execution count after clearing"
        page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
        run = NotebookRun(name=name, page=page, state=state, seconds=0.0, open_seconds=t0 - t_open,
                          console=page._labkit_console)  # type: ignore[attr-defined]
        self.current = run
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while True:
            light = run.refresh(full=False)
            code = [c for c in light["cells"] if c["type"] == "code" and not c["blank"]]
            missing = [c["index"] for c in code if not c["executionCount"]]
            pending = [c["index"] for c in code if "*" in c["prompt"]]
            if not missing and light["kernelStatus"] == "idle":
                break
            if missing and not pending and light["kernelStatus"] == "idle" and time.monotonic() - t0 > 5:
                state = run.refresh()
                errors = {c["index"]: error_outputs(c) for c in state["cells"] if error_outputs(c)}
                raise AssertionError(f"{name}: Run All stopped; cells {missing} never ran. "
                                     f"Errors: {errors}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{name}: Run All did not finish in {RUN_TIMEOUT_S:.0f} s; "
                                     f"cells {missing} have no execution count (pending {pending}, "
                                     f"kernel {light['kernelStatus']})")
            time.sleep(0.5)
        run.seconds = time.monotonic() - t0
        run.refresh()
        return run


