"""JupyterHub + batchspawner's SlurmSpawner, end to end, with slurm/jupyterhub/jupyterhub_config.py as shipped.

A real hub runs in the login namespace (a test-only config loads the shipped one and swaps PAM for a shared-password
authenticator, sudo for runuser, and adds an API token for the test). nbgitpuller pulls the workbook from a git
daemon on the login host into each home. Headless Chromium on the "laptop" logs in, fills the resource form, gets a
JupyterLab that runs as a Slurm job on a compute node, opens notebook 01 and runs cells. A second user is spawned
through the REST API on the other partition with a GPU; neither user can reach the other's server, files or token.
Stop cancels the job. The hub restarts with a shorter idle limit (a config change mid-class): the other job survives
and is found again, and the idle culler stops it, which cancels the job too.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import csv
import ipaddress
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from classenv import ClassEnv
from nscluster import MARKER, NODES, ClusterUser, NsCluster, _kill_and_wait

REPO = Path(__file__).resolve().parents[2]
HUB_CONFIG = REPO / "slurm" / "jupyterhub" / "jupyterhub_config.py"
sys.path.insert(0, str(REPO / "tests" / "browser"))
from labdriver import CHROMIUM, CHROMIUM_ARGS, KERNEL_IDLE  # noqa: E402

# The culler's idle limit: long while the browser works (a loaded machine may need minutes from login to a running
# kernel, and a server is idle to the culler until the browser reaches JupyterLab), short after the hub's restart.
CULL_IDLE_FIRST_S, CULL_IDLE_S = 900, 45
ARTIFACTS = Path(os.environ.get("LABKIT_BROWSER_ARTIFACTS", REPO / "build" / "browser-artifacts"))


def notebook_01() -> str:
    (name,) = [p.name for p in (REPO / "notebooks").glob("01_*.ipynb")]
    return f"notebooks/{name}"


def wait_for(what: str, fn, timeout: float, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@dataclass
class Hub:
    cluster: NsCluster
    url: str
    token: str
    password: str
    users: dict[str, ClusterUser]
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    log: Path
    proc: subprocess.Popen | None = None
    extra: list[subprocess.Popen] = field(default_factory=list)

    def start(self, timeout: float = 60) -> float:
        """Start the hub in the login namespace; return the seconds until its API answered."""
        t0 = time.monotonic()
        self.proc = self.cluster.popen("login", self.argv, self.log, env=self.env, cwd=str(self.cwd))

        def up():
            if self.proc.poll() is not None:
                raise AssertionError(f"the hub exited with {self.proc.returncode}:\n{self.tail()}")
            with contextlib.suppress(OSError):
                return self.api("GET", "/users")[0] == 200
            return False

        wait_for("the hub's API", up, timeout)
        return time.monotonic() - t0

    def stop(self) -> None:
        """SIGTERM the hub (and its proxy and culler, which it stops itself); SIGKILL after 10 s."""
        if self.proc is not None:
            _kill_and_wait([self.proc.pid], timeout=10)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(1)

    def api(self, method: str, path: str, body: Any = None, token: str | None = None,
            base: str = "/hub/api") -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.url}{base}{path}", method=method, data=data,
                                     headers={"Authorization": f"token {token or self.token}",
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                raw = r.read()
                status = r.status
        except urllib.error.HTTPError as e:
            raw, status = e.read(), e.code
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")

    def touch(self, user: ClusterUser) -> float:
        """Report activity of the user's server now (as its own activity reports do); return the monotonic time."""
        now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
        status, body = self.api("POST", f"/users/{user.name}/activity",
                                {"last_activity": now, "servers": {"": {"last_activity": now}}})
        assert status == 200, (status, body)
        return time.monotonic()

    def server(self, user: ClusterUser) -> dict:
        status, info = self.api("GET", f"/users/{user.name}")
        assert status == 200, info
        return info["servers"].get("", {})

    def job(self, user: ClusterUser) -> str | None:
        """The user's running (or pending) Slurm job, if any."""
        jobs = self.cluster.slurm("squeue", "-h", "-u", user.name, "-o", "%i", timeout=20).stdout.split()
        assert len(jobs) <= 1, jobs
        return jobs[0] if jobs else None

    def server_process(self, user: ClusterUser) -> tuple[str, int]:
        """(node, pid) of the user's jupyterhub-singleuser process."""
        for n in NODES:
            for pid in self.cluster.ns_pids(n):
                with contextlib.suppress(OSError, IndexError):
                    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                    # batchspawner-singleuser runs jupyterhub-singleuser in its own (python) process
                    if os.stat(f"/proc/{pid}").st_uid == user.uid and Path(argv[0].decode()).name.startswith(
                            "python") and b"jupyterhub-singleuser" in argv:
                        return n, pid
        raise AssertionError(f"no jupyterhub-singleuser process of {user.name} on the nodes")

    def tail(self, n: int = 60) -> str:
        """The hub log's last lines, without the servers' activity reports and the culler's polls (every few s)."""
        lines = [line for line in self.log.read_text(errors="replace").splitlines()
                 if "/activity (" not in line and "(idle-culler@" not in line]
        return "\n".join(lines[-n:])


def gitpuller_error(page) -> str | None:
    """The error nbgitpuller's page shows in its progress bar ("Error: ..."), or None while it has none."""
    with contextlib.suppress(Exception):
        bar = page.locator("#status-panel-title")
        if bar.count() and "progress-bar-danger" in (bar.get_attribute("class", timeout=2_000) or ""):
            return bar.inner_text(timeout=2_000).strip()
    return None


def server_log(user: ClusterUser, job: str | None, n: int = 40) -> str:
    """The last lines of the user's JupyterLab server log (the batch script's output in the home)."""
    if not job:
        return f"({user.name} has no job)"
    log = user.home / f".labkit-hub-{job}.log"
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-n:])
    except OSError as exc:
        return f"({log}: {exc})"


def listening_sockets(pid: int) -> set[tuple[str, int]]:
    """(address, port) of the TCP sockets ``pid`` listens on, read in its own network namespace."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            m = re.fullmatch(r"socket:\[(\d+)\]", os.readlink(fd))
            if m:
                inodes.add(m.group(1))
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # LISTEN
                host, port = f[1].split(":")
                if table == "tcp":
                    addr = ".".join(str(int(host[i:i + 2], 16)) for i in (6, 4, 2, 0))
                else:
                    addr = str(ipaddress.IPv6Address(bytes.fromhex("".join(
                        host[i:i + 8][j:j + 2] for i in range(0, 32, 8) for j in (6, 4, 2, 0)))))
                found.add((addr, int(port, 16)))
    return found


def _environ(pid: int) -> dict[str, str]:
    items = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(i.decode(errors="replace").split("=", 1) for i in items if b"=" in i)


@pytest.fixture(scope="module")
def hub(cluster: NsCluster, class_env: ClassEnv, workbook: Path) -> Iterator[Hub]:
    b = cluster.base
    users = {s: cluster.add_user(s) for s in ("ada", "bo")}
    # the class's git repository (the student build, in real life), served by a git daemon on the login host
    git = ["git", "-c", "user.name=labkit-tests", "-c", "user.email=tests@labkit.invalid"]
    subprocess.run([*git, "init", "-q", "-b", "main"], cwd=workbook, check=True, timeout=60)
    subprocess.run([*git, "add", "-A"], cwd=workbook, check=True, timeout=120)
    subprocess.run([*git, "commit", "-q", "-m", "the workbook under test"], cwd=workbook, check=True, timeout=120)
    (b / "git").mkdir()
    subprocess.run(["git", "clone", "-q", "--bare", str(workbook), str(b / "git" / "labkit.git")], check=True,
                   timeout=120)
    daemon = cluster.popen("login", ["git", "daemon", "--reuseaddr", "--export-all", f"--base-path={b}/git",
                                     f"--listen={cluster.addr['login']}", "--port=9418"], b / "log" / "git-daemon.log")
    hubdir = b / "hub"
    hubdir.mkdir(mode=0o700)
    token, password = secrets.token_hex(32), secrets.token_hex(12)
    test_config = hubdir / "test_config.py"
    test_config.write_text(f"""\
# Test-only additions to the shipped config (tests/cluster/test_jupyterhub.py).
c = get_config()  # noqa
load_subconfig({str(HUB_CONFIG)!r})  # noqa
c.JupyterHub.authenticator_class = "shared-password"
c.SharedPasswordAuthenticator.user_password = {password!r}
c.Authenticator.allowed_users = {sorted(u.name for u in users.values())!r}
c.SlurmSpawner.exec_prefix = "/usr/sbin/runuser -u {{username}} --"  # no sudo on the test machine
c.JupyterHub.services.append({{"name": "labkit-tests", "api_token": {token!r}}})
c.JupyterHub.load_roles.append({{"name": "labkit-tests", "services": ["labkit-tests"],
                                "scopes": ["admin:users", "admin:servers", "list:users", "read:users",
                                           "users:activity"]}})
c.Spawner.environment["PYTHONPATH"] = {str(workbook)!r}  # the labkit under test, not the cached class env's
c.Spawner.environment["JUPYTERHUB_ACTIVITY_INTERVAL"] = "5"  # servers report activity often: the culler test
c.Spawner.args = ["--LabApp.expose_app_in_browser=True", "--LabApp.news_url="]
""")
    test_config.chmod(0o600)
    env = cluster.env
    env.update(
        LABKIT_HUB_VENV=str(class_env.path), LABKIT_HUB_WORKBOOK=str(workbook),
        LABKIT_HUB_REPO="git://login/labkit.git", LABKIT_HUB_OPEN=notebook_01(),
        LABKIT_HUB_PARTITIONS="debug,gpu", LABKIT_HUB_MAX_GPUS="2", LABKIT_HUB_MAX_HOURS="4",
        LABKIT_HUB_DEFAULT_HOURS="2", LABKIT_HUB_CPUS="1",
        LABKIT_HUB_BIND_URL=f"http://{cluster.login_public_addr}:8000", LABKIT_HUB_IP=cluster.addr["login"],
        LABKIT_HUB_ALLOW_PUBLIC_HTTP="yes",  # the test cluster's own network namespace: nobody else on it
        LABKIT_HUB_STATE_DIR=str(hubdir / "state"), LABKIT_HUB_CULL_IDLE=str(CULL_IDLE_FIRST_S),
        LABKIT_HUB_CULL_EVERY="5", LABKIT_HUB_START_TIMEOUT="180",
    )
    h = Hub(cluster, f"http://{cluster.login_public_addr}:8000", token, password, users,
            [str(class_env.path / "bin" / "jupyterhub"), "-f", str(test_config)], env, hubdir,
            b / "log" / "jupyterhub.log", extra=[daemon])
    try:
        proxy = shutil.which("configurable-http-proxy", path=env["PATH"]) or "the pure-Python one in the class env"
        print(f"\nJupyterHub up in {h.start():.1f} s at {h.url}; proxy: {proxy}")
        yield h
    finally:
        # cleanup_servers is off in the shipped config (a hub restart must not end a class): stop them first
        with contextlib.suppress(Exception):
            for u in users.values():
                if h.server(u):
                    h.api("DELETE", f"/users/{u.name}/server")
        h.stop()
        for p in h.extra:
            _kill_and_wait([p.pid], timeout=10)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(1)
        left = cluster.slurm("squeue", "-h", "-o", "%i %u", timeout=20, check=False).stdout.strip()
        if left:
            cluster.slurm("scancel", *[line.split()[0] for line in left.splitlines()], check=False)
        assert not left, f"jobs left after the hub stopped its servers: {left}"


def reached_lab(page, hub: Hub, user: ClusterUser, url: re.Pattern, timeout_s: float) -> None:
    """Wait for the browser to land in JupyterLab after the spawn form.

    On a loaded machine the spawn-pending page can miss its redirect: its progress stream reports "ready" a moment
    before the proxy has the user's route, the page's next request gets a 503, and it stays on "Your server is
    starting up". A person reloads; so does this, once the hub says the server is ready and the page has not moved.

    nbgitpuller's page can stop in the same way: a second load of the page (the login's redirects can load it
    twice) opens a second event stream while the first pull still holds the server's git lock and clones; that
    stream is refused (not an event stream: the page says "Error: undefined"), or nbgitpuller says "Another git
    operation is currently running, try again in a few minutes". A person waits and reloads; so does this, 5 s
    later, up to three times (seen once in CI: an immediate reload met the lock again). Any other error of
    nbgitpuller (the clone failed, a merge conflict) fails the test with nbgitpuller's words.
    """
    deadline = time.monotonic() + timeout_s
    stuck_since = None
    pull_reloads = 0
    while time.monotonic() < deadline:
        if url.search(page.url):
            return
        if "/spawn-pending/" in page.url and hub.server(user).get("ready"):
            stuck_since = stuck_since or time.monotonic()
            if time.monotonic() - stuck_since > 10:
                print(f"\nthe spawn-pending page missed its redirect; reloading ({page.url})")
                page.reload()
                stuck_since = None
        if "/git-pull" in page.url:
            said = gitpuller_error(page)
            if said is not None:
                transient = said in ("Error: undefined", "Error: null") or "try again" in said
                if pull_reloads >= 3 or not transient:
                    raise AssertionError(f"nbgitpuller stopped at {page.url}: {said!r}"
                                         + (f" (after {pull_reloads} reloads)" if pull_reloads else ""))
                # The first pull may still hold the git lock (it clones while a second page load's stream is
                # refused): give it time, as the message asks, then reload.
                print(f"\nnbgitpuller's page stopped ({said!r}); reloading in 5 s, as its message asks")
                pull_reloads += 1
                page.wait_for_timeout(5000)
                page.reload()
        page.wait_for_timeout(500)  # not time.sleep: Playwright's sync API updates page.url only inside its calls
    raise AssertionError(f"the browser did not reach {url.pattern} in {timeout_s} s; it is at {page.url}")


def run_cell(page, index: int, timeout_s: float = 120) -> dict:
    """Run cell ``index`` of the open notebook in JupyterLab; return {count, outputs}."""
    page.evaluate("""(i) => { const nb = window.jupyterapp.shell.currentWidget.content;
                              nb.activeCellIndex = i;
                              return window.jupyterapp.commands.execute('notebook:run-cell'); }""", index)
    js = """(i) => { const m = window.jupyterapp.shell.currentWidget.content.widgets[i].model;
                     return {count: m.executionCount, outputs: m.outputs.toJSON(),
                             busy: window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status}; }"""
    return wait_for(f"cell {index} to run", lambda: (lambda r: r if r["count"] and r["busy"] == "idle" else None)(
        page.evaluate(js, index)), timeout_s, interval=0.25)


def run_code(page, code: str) -> str:
    """Run ``code`` in the kernel of the open notebook, as a learner's new cell would; return what it printed (an
    error as "ERROR name: value")."""
    return page.evaluate("""async (code) => {
        const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
        const future = kernel.requestExecute({code: code, stop_on_error: true});
        let out = "";
        future.onIOPub = (msg) => {
            if (msg.header.msg_type === "stream") { out += msg.content.text; }
            if (msg.header.msg_type === "error") { out += "ERROR " + msg.content.ename + ": " + msg.content.evalue; }
        };
        await future.done;
        return out; }""", code)


# What each student does in their own kernel: solve some exercises, then export the record for the class (from the
# home folder: the pulled checkout's notebooks/ are the reference notebooks, where checks record nothing).
STUDENT_WORK = {
    "ada": 'check("01.fp16-max", 65536.0)\ncheck("01.fp16-max", 65504.0)',
    "bo": 'check("02.first-int", 2048)\nsolution("01.bf16-eps")\ncheck("01.bf16-eps", 2.0**-7)',
}


def solve_and_export(page, who: str) -> str:
    out = run_code(page, "import os, subprocess, sys\nos.chdir(os.path.expanduser('~'))\n"
                         "from labkit.check import check, solution\n" + STUDENT_WORK[who] + "\n"
                         "r = subprocess.run([sys.executable, '-m', 'labkit', 'progress', '--export'], "
                         "capture_output=True, text=True)\nprint(r.stdout, r.stderr)")
    assert "ERROR" not in out and "labkit-results.json" in out, out
    return out


def text_of(outputs: list[dict]) -> str:
    return "".join("".join(o.get("text", "")) for o in outputs if o.get("output_type") == "stream")


def test_hub_spawns_slurm_jobs_isolates_users_and_cancels_them(hub: Hub, cluster: NsCluster, class_env: ClassEnv,
                                                               workbook: Path, record_property):
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    # In the full suite the browser tests' session-scoped Playwright keeps an asyncio loop running in this thread,
    # and sync_playwright refuses to start inside one: the scenario runs in a thread of its own.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(_hub_scenario, hub, cluster, record_property).result()
    # ---- the instructor gathers the class's exported records from the homes: both students, each under the login
    # that owns the file --------------------------------------------------------------------------------------------
    ada, bo = hub.users["ada"], hub.users["bo"]
    for u in (ada, bo):
        assert (u.home / "labkit-results.json").stat().st_uid == u.uid
    out = cluster.base / "class-report"
    rep = subprocess.run([str(class_env.python), "-m", "labkit", "class-report",
                          str(ada.home.parent / "*" / "labkit-results.json"), "--out", str(out)],
                         env={**os.environ, "PYTHONPATH": str(workbook)}, capture_output=True, text=True, timeout=120)
    a, b = ada.name, bo.name
    assert rep.returncode == 0 and f"2 learners ({a}, {b})" in rep.stdout, (rep.stdout, rep.stderr)
    rows = {(r["learner"], r["exercise"]): r for r in csv.DictReader((out / "class-results.csv").open())}
    assert set(rows) == {(a, "01.fp16-max"), (b, "02.first-int"), (b, "01.bf16-eps")}, rows
    assert rows[a, "01.fp16-max"]["status"] == "correct" and rows[a, "01.fp16-max"]["attempts"] == "2"
    assert rows[b, "02.first-int"]["status"] == "wrong"
    assert rows[b, "01.bf16-eps"]["solved_after_solution"] == "True"
    assert f"{a}, {b}" in (out / "class-results.html").read_text()


def _hub_scenario(hub: Hub, cluster: NsCluster, record_property) -> None:
    from playwright.sync_api import sync_playwright

    ada, bo = hub.users["ada"], hub.users["bo"]
    nb = notebook_01()
    stored = json.loads((REPO / nb).read_text())["cells"]
    code = [i for i, c in enumerate(stored) if c["cell_type"] == "code"]
    timings: dict[str, float] = {}
    with sync_playwright() as pw:
        # the run's marker in Chromium's environment: a crashed run's browser is found and ended by the next one
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
                                     env={**os.environ, MARKER: cluster.env[MARKER]})
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        context.set_default_timeout(90_000)
        page = context.new_page()
        console: list[str] = []
        page.on("console", lambda m: console.append(f"[{m.type}] {m.text}"))
        try:
            # ---- ada logs in, fills the resource form, and lands in notebook 01 of her own copy --------------
            page.goto(f"{hub.url}/hub/login")
            page.fill("#username_input", ada.name)
            page.fill("#password_input", hub.password)
            page.click("#login_submit")
            page.wait_for_selector("#labkit-partition")
            assert page.locator("#labkit-partition option").all_inner_texts() == ["debug", "gpu"]
            page.select_option("#labkit-partition", "debug")
            page.select_option("#labkit-hours", "1")
            page.fill("#labkit-gpus", "0")
            t0 = time.monotonic()
            page.locator("form#spawn_form [type=submit], #spawn_form button[type=submit]").first.click()
            reached_lab(page, hub, ada, re.compile(rf"/user/{ada.name}/lab/tree/labkit/{re.escape(nb)}"), 240)
            timings["spawn_to_notebook_s"] = time.monotonic() - t0
            page.locator("#jp-main-statusbar").get_by_text(KERNEL_IDLE, exact=False).first.wait_for(
                state="visible", timeout=120_000)
            timings["notebook_to_kernel_idle_s"] = time.monotonic() - t0 - timings["spawn_to_notebook_s"]
            assert (ada.home / "labkit" / nb).is_file(), "nbgitpuller must have put the workbook in ada's home"
            assert (ada.home / "labkit" / nb).stat().st_uid == ada.uid

            # ---- her server is a Slurm job on a compute node, as her, on the node's address --------------------
            job_a = hub.job(ada)
            info = cluster.job(job_a)
            assert info["JobState"] == "RUNNING" and info["UserId"].startswith(f"{ada.name}("), info
            assert info["Partition"] == "debug" and info["TimeLimit"] == "01:00:00" and info["JobName"] == "labkit-hub"
            node_a, pid_a = hub.server_process(ada)
            assert info["NodeList"] == node_a
            listening = listening_sockets(pid_a)
            assert listening and all(ip == cluster.addr[node_a] for ip, _ in listening), listening
            env_a = _environ(pid_a)
            assert env_a["LABKIT_VENV"] and env_a["VIRTUAL_ENV"] == env_a["LABKIT_VENV"], "slurm/env.sh activated it"
            assert env_a["JUPYTER_RUNTIME_DIR"].startswith("/tmp/labkit-hub-"), "node-local runtime files"

            # ---- run cells of notebook 01: the imports, then one whose output is exact -------------------------
            t1 = time.monotonic()
            run_cell(page, code[0], timeout_s=180)
            first = run_cell(page, code[1])
            timings["two_cells_s"] = time.monotonic() - t1
            errors = [o for o in first["outputs"] if o.get("output_type") == "error"]
            assert not errors, errors
            assert text_of(first["outputs"]) == "".join("".join(o.get("text", "")) for o in stored[code[1]]["outputs"])
            solve_and_export(page, "ada")  # a student at work: checks, then `python -m labkit progress --export`

            # ---- bo asks through the REST API: bad options are refused, then the gpu partition with 1 GPU ------
            assert hub.api("POST", f"/users/{bo.name}")[0] in (201, 409)
            status, body = hub.api("POST", f"/users/{bo.name}/server", {"partition": "gpu", "hours": 2, "gpus": 9})
            assert status == 400, (status, body)
            status, body = hub.api("POST", f"/users/{bo.name}/server", {"partition": "x; rm -rf ~", "gpus": 0})
            assert status == 400, (status, body)
            assert hub.job(bo) is None and not hub.server(bo)
            t2 = time.monotonic()
            status, body = hub.api("POST", f"/users/{bo.name}/server",
                                   {"partition": "gpu", "hours": 2, "gpus": 1, "cmd": "evil", "srun": "evil"})
            assert status in (201, 202), (status, body)
            wait_for("bo's server to be ready", lambda: hub.server(bo).get("ready"), 180)
            timings["api_spawn_s"] = time.monotonic() - t2
            job_b = hub.job(bo)
            info_b = cluster.job(job_b)
            assert job_b != job_a and info_b["UserId"].startswith(f"{bo.name}("), info_b
            assert info_b["Partition"] == "gpu" and info_b["TimeLimit"] == "02:00:00", info_b
            assert "gpu:1" in info_b.get("TresPerNode", "") + info_b.get("Gres", ""), info_b
            node_b, pid_b = hub.server_process(bo)
            env_b = _environ(pid_b)
            assert env_b.get("CUDA_VISIBLE_DEVICES") == "0", "Slurm gave the job the GPU it asked for"
            script = cluster.slurm("scontrol", "write", "batch_script", job_b, "-", timeout=20).stdout
            assert "evil" not in script, "options the form does not offer must never reach the batch script"

            # ---- neither user can reach the other's server, files or token --------------------------------------
            tok_a, tok_b = env_a["JUPYTERHUB_API_TOKEN"], env_b["JUPYTERHUB_API_TOKEN"]
            assert hub.api("GET", "/api/status", token=tok_a, base=f"/user/{ada.name}")[0] == 200
            assert hub.api("GET", "/api/status", token=tok_b, base=f"/user/{bo.name}")[0] == 200
            assert hub.api("GET", "/api/contents", token=tok_a, base=f"/user/{bo.name}")[0] == 403
            assert hub.api("GET", "/api/contents", token=tok_b, base=f"/user/{ada.name}")[0] == 403
            assert hub.api("GET", f"/users/{bo.name}", token=tok_a)[0] in (403, 404)
            reply = page.goto(f"{hub.url}/user/{bo.name}/lab")  # ada's browser session at bo's server
            assert reply is not None and reply.status == 403, (reply.status if reply else None, page.url)
            for who, other, other_pid, other_job in ((ada, bo, pid_b, job_b), (bo, ada, pid_a, job_a)):
                for argv in (["cat", f"/proc/{other_pid}/environ"], ["ls", str(other.home)],
                             ["cat", str(other.home / f".labkit-hub-{other_job}.log")],
                             ["cat", str(other.home / "labkit" / nb)]):
                    res = subprocess.run(["runuser", "-u", who.name, "--", *argv], capture_output=True, timeout=20)
                    assert res.returncode != 0 and b"Permission denied" in res.stderr, (who.name, argv, res)
                res = cluster.slurm("scontrol", "write", "batch_script", other_job, "-", user=who.name, check=False)
                # (scontrol 22.05 exits 0 here, saying "job script retrieval failed: Invalid user id")
                assert "#SBATCH" not in res.stdout and "failed" in res.stderr, (who.name, res)
            for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):  # command lines are world-readable
                with contextlib.suppress(OSError):
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                    assert tok_a.encode() not in cmdline and tok_b.encode() not in cmdline, pid

            # ---- bo opens his JupyterLab in a browser of his own, solves other exercises and exports -------------------
            context_b = browser.new_context(viewport={"width": 1400, "height": 1000})
            context_b.set_default_timeout(90_000)
            console_b: list[str] = []
            page_b = context_b.new_page()
            page_b.on("console", lambda m: console_b.append(f"[{m.type}] {m.text}"))
            try:
                page_b.goto(f"{hub.url}/hub/login")
                page_b.fill("#username_input", bo.name)
                page_b.fill("#password_input", hub.password)
                page_b.click("#login_submit")
                page_b.goto(f"{hub.url}/user/{bo.name}/")  # his server's default URL: nbgitpuller, then notebook 01
                reached_lab(page_b, hub, bo, re.compile(rf"/user/{bo.name}/lab/tree/labkit/{re.escape(nb)}"), 240)
                page_b.locator("#jp-main-statusbar").get_by_text(KERNEL_IDLE, exact=False).first.wait_for(
                    state="visible", timeout=180_000)
                solve_and_export(page_b, "bo")
            except BaseException:
                ARTIFACTS.mkdir(parents=True, exist_ok=True)
                with contextlib.suppress(Exception):
                    page_b.screenshot(path=str(ARTIFACTS / "jupyterhub-failure-bo.png"), full_page=True)
                (ARTIFACTS / "jupyterhub-console-bo.txt").write_text("\n".join(console_b))
                print(f"\n--- bo's page at {page_b.url}; its console:\n" + "\n".join(console_b[-30:])
                      + f"\n--- bo's server log\n{server_log(bo, job_b)}")
                raise
            finally:
                context_b.close()  # his JupyterLab closed: no more activity, for the culler below

            hub.touch(bo)  # bo stays idle from here on; the culler must not take him before the restart below

            # ---- ada's use reaches the hub as activity (what keeps the culler off a server in use) ---------------
            started = hub.server(ada)["started"]
            wait_for("ada's activity to reach the hub", lambda: hub.server(ada)["last_activity"] > started, 30)

            # ---- ada stops her server from the hub's home page: her job is cancelled ------------------------------
            page.goto(f"{hub.url}/hub/home")
            t3 = time.monotonic()
            page.click("#stop")
            rec = cluster.wait_job_end(job_a, 60)
            timings["stop_to_cancelled_s"] = time.monotonic() - t3
            assert rec["JobState"] == "CANCELLED", rec
            wait_for("ada's processes to end", lambda: not cluster.job_processes(job_a), 30)
            wait_for("the hub to see ada's server stopped", lambda: not hub.server(ada), 30)
            assert not list(Path("/tmp").glob(f"labkit-hub-{job_a}.*")), "the node-local folder goes with the job"
        except BaseException:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(Exception):
                page.screenshot(path=str(ARTIFACTS / "jupyterhub-failure.png"), full_page=True)
            (ARTIFACTS / "jupyterhub-console.txt").write_text("\n".join(console))
            with contextlib.suppress(Exception):
                print(f"\n--- ada's server log\n{server_log(ada, hub.job(ada))}")
            print(f"\n--- hub log\n{hub.tail(80)}\n--- screenshot and console in {ARTIFACTS}\n--- timings {timings}")
            raise
        finally:
            context.close()
            browser.close()

    # ---- the hub restarts with a shorter idle limit (a config change mid-class): bo's job keeps running and the
    # new hub finds it ----------------------------------------------------------------------------------------------
    t_idle = t5 = hub.touch(bo)
    hub.stop()
    assert cluster.job(job_b)["JobState"] == "RUNNING", "stopping the hub must not end the students' jobs"
    hub.env["LABKIT_HUB_CULL_IDLE"] = str(CULL_IDLE_S)
    hub.start()
    wait_for("bo's server to be found again", lambda: hub.server(bo).get("ready"), 60)
    timings["hub_restart_s"] = time.monotonic() - t5
    assert hub.job(bo) == job_b and hub.server_process(bo)[1] == pid_b
    assert hub.api("GET", "/api/status", token=tok_b, base=f"/user/{bo.name}")[0] == 200, hub.tail()

    # ---- bo did nothing since his server started: the idle culler stops it, and Slurm cancels the job -----------
    t4 = time.monotonic()
    rec = cluster.wait_job_end(job_b, CULL_IDLE_S + 60)
    timings["culled_after_idle_s"] = time.monotonic() - t_idle
    assert rec["JobState"] == "CANCELLED", rec
    assert re.search(rf"Culling server {bo.name}\b", hub.log.read_text()), hub.tail()
    wait_for("bo's processes to end", lambda: not cluster.job_processes(job_b), 30)
    assert not cluster.job_processes(), cluster.job_processes()
    for k, v in timings.items():
        record_property(k, round(v, 1))
    print("\n" + ", ".join(f"{k} {v:.1f}" for k, v in timings.items())
          + f" (culler wait {time.monotonic() - t4:.0f} s)")


def _load_config(env: dict[str, str]) -> dict[str, Any]:
    namespace: dict[str, Any] = {"get_config": lambda: _Config()}
    base = {"LABKIT_HUB_STATE_DIR": "/nonexistent/never-created", "LABKIT_HUB_IP": "127.0.0.1"}
    with _patched_env({**base, **env}), _no_makedirs():
        exec(compile(HUB_CONFIG.read_text(), str(HUB_CONFIG), "exec"), namespace)
    return namespace


def test_the_hub_listens_on_loopback_by_default_and_refuses_plain_http_elsewhere():
    ns = _load_config({"LABKIT_HUB_BIND_URL": "http://127.0.0.1:8000"})
    assert ns["c"].JupyterHub.bind_url == "http://127.0.0.1:8000"
    default = re.search(r'setting\("LABKIT_HUB_BIND_URL", "([^"]+)"\)', HUB_CONFIG.read_text())
    assert default and ns["check_bind_url"](default.group(1), "", "", False) == ("http", "127.0.0.1")
    check = ns["check_bind_url"]
    for url in ("http://:8000", "http://0.0.0.0:8000", "http://10.0.0.5:8000", "http://login.cluster:8000"):
        with pytest.raises(ValueError, match="in clear"):
            check(url, "", "", False)
        assert check(url, "", "", True)[0] == "http"  # the explicit override
    with pytest.raises(ValueError, match="SSL_CERT"):
        check("https://:443", "", "", False)
    assert check("https://:443", "/etc/ssl/hub.pem", "/etc/ssl/hub.key", False) == ("https", "")
    assert check("http://localhost:8000", "", "", False) == ("http", "localhost")
    with pytest.raises(ValueError, match="http:// or https://"):
        check("ftp://:21", "", "", True)
    with pytest.raises(ValueError, match="in clear"):  # the config file itself refuses to load
        _load_config({"LABKIT_HUB_BIND_URL": "http://:8000"})
    tls = _load_config({"LABKIT_HUB_BIND_URL": "https://:443", "LABKIT_HUB_SSL_CERT": "/c.pem",
                        "LABKIT_HUB_SSL_KEY": "/c.key"})
    assert (tls["c"].JupyterHub.ssl_cert, tls["c"].JupyterHub.ssl_key) == ("/c.pem", "/c.key")


def test_form_and_api_options_are_validated():
    """The form's validation on its own (the hub test above covers how it is wired in)."""
    namespace: dict[str, Any] = {"get_config": lambda: _Config()}
    env = {"LABKIT_HUB_PARTITIONS": "debug,gpu", "LABKIT_HUB_MAX_GPUS": "2", "LABKIT_HUB_MAX_HOURS": "4",
           "LABKIT_HUB_STATE_DIR": "/nonexistent/never-created", "LABKIT_HUB_IP": "127.0.0.1"}
    with _patched_env(env), _no_makedirs():
        exec(compile(HUB_CONFIG.read_text(), str(HUB_CONFIG), "exec"), namespace)
    opts = namespace["labkit_options"]
    assert opts({}) == {"partition": "debug", "hours": 2, "gpus": 0, "runtime": "02:00:00", "ngpus": "0"}
    assert opts({"partition": ["gpu"], "hours": ["4"], "gpus": ["2"]})["runtime"] == "04:00:00"
    assert opts(opts({"partition": "gpu", "gpus": 1})) == opts({"partition": "gpu", "gpus": 1})  # idempotent
    assert set(opts({"cmd": "x", "prologue": "y", "homedir": "/"})) == {"partition", "hours", "gpus", "runtime",
                                                                        "ngpus"}
    for bad in ({"partition": "long"}, {"hours": "0"}, {"hours": "5"}, {"hours": "1\n#SBATCH -w x"},
                {"gpus": "3"}, {"gpus": "-1"}, {"gpus": "1.5"}, {"partition": "debug\nrm -rf ~"}):
        with pytest.raises(ValueError):
            opts(bad)
    form = namespace["_options_form"](None)
    assert 'name="partition"' in form and 'name="hours"' in form and 'name="gpus"' in form and 'max="2"' in form


class _Config:
    """Enough of traitlets' config object for exec'ing the config file: any attribute chain can be set."""

    def __getattr__(self, name: str) -> Any:
        value = _Config()
        object.__setattr__(self, name, value)
        return value


@contextlib.contextmanager
def _patched_env(values: dict[str, str]) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _no_makedirs() -> Iterator[None]:
    real = os.makedirs
    os.makedirs = lambda *a, **k: None  # type: ignore[assignment]
    try:
        yield
    finally:
        os.makedirs = real  # type: ignore[assignment]


@pytest.mark.parametrize("ngpus,memory", [("0", ""), ("2", "8G")])
def test_batch_script_renders_and_is_shellcheck_clean(ngpus: str, memory: str):
    """The config's batch script, rendered as batchspawner renders it (jinja2), is clean bash; GPUs only when asked."""
    import jinja2

    script = re.search(r'c\.SlurmSpawner\.batch_script = """(.*?)"""', HUB_CONFIG.read_text(), re.S).group(1)
    out = jinja2.Template(script).render(
        homedir="/home/u", keepvars="PATH,LABKIT_ROOT", partition="debug", runtime="02:00:00", nprocs="2",
        memory=memory, ngpus=ngpus, account="", reservation="", prologue="", epilogue="", srun="srun --export=ALL",
        cmd="batchspawner-singleuser jupyterhub-singleuser")
    assert ("#SBATCH --gres=gpu:2" in out) == (ngpus == "2") and ("#SBATCH --mem=8G" in out) == bool(memory)
    assert "--account" not in out and "--reservation" not in out
    assert 'source "${LABKIT_ROOT}/slurm/env.sh"' in out and "\nsrun --export=ALL batchspawner-singleuser" in out
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
            pytest.fail("CI=true and shellcheck is missing (apt-get install -y shellcheck)")
        pytest.skip("shellcheck is missing (apt-get install -y shellcheck)")
    # SC1091: env.sh's path is known only on the cluster (tests/slurm checks env.sh itself)
    res = subprocess.run([shellcheck, "-s", "bash", "-S", "style", "-e", "SC1091", "-"], input=out,
                         capture_output=True, text=True,
                         timeout=60, check=False)
    assert res.returncode == 0, res.stdout
