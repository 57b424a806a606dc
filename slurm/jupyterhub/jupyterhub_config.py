# JupyterHub for a labkit class on a Slurm cluster: every student's JupyterLab runs as a Slurm job on a compute
# node, started from a web form, reached through the hub (no tunnel), and ended by Stop, by the idle culler or by
# the time limit. Read slurm/jupyterhub/README.md first; this file is what a cluster admin adapts.
#
#   jupyterhub -f slurm/jupyterhub/jupyterhub_config.py        # on the login (or a service) node, as root
#
# Every site setting below is read as os.environ.get("LABKIT_HUB_...", default): edit the defaults, or set the
# variables in the hub's service unit. tests/cluster/test_jupyterhub.py runs this very file on a test cluster.
# Versions: jupyterhub>=6.1,<7, batchspawner>=1.3 (pip install "labkit[hub]" or ".[hub]" from the workbook).
import html
import ipaddress
import os
import re
import shutil
import socket
import sys
from urllib.parse import urlencode, urlsplit

c = get_config()  # noqa: F821  (JupyterHub provides get_config in its config files)


def setting(name, default):
    return os.environ.get(name, default)


# ---- SITE: adapt these ---------------------------------------------------------------------------------------
# The class environment: a venv (or conda env) that every student can run, with labkit and ".[hub]" installed
# (docs/instructor.md, section 2). Jobs activate it through slurm/env.sh, like every other labkit job.
LABKIT_ENV = setting("LABKIT_HUB_ENV", "venv")                       # venv, conda, module or none (slurm/env.sh)
LABKIT_VENV = setting("LABKIT_HUB_VENV", "/project/labkit-class/.venv")
LABKIT_CONDA_ENV = setting("LABKIT_HUB_CONDA_ENV", "")
LABKIT_MODULES = setting("LABKIT_HUB_MODULES", "")                   # e.g. "python/3.11 cuda/12.4"
# A copy of the workbook that students can read and that holds slurm/env.sh (the student build is enough).
LABKIT_ROOT = setting("LABKIT_HUB_WORKBOOK", "/project/labkit-class/dist/student")
# nbgitpuller: where each student's own copy comes from (a git URL of the student build), pulled into
# ~/labkit at every start. Pulling merges: a student's edits are kept. Empty: no pull, JupyterLab opens ~.
WORKBOOK_REPO = setting("LABKIT_HUB_REPO", "")
WORKBOOK_BRANCH = setting("LABKIT_HUB_BRANCH", "main")
FIRST_NOTEBOOK = setting("LABKIT_HUB_OPEN", "notebooks/00_environment.ipynb")
# The resource form: partitions to offer (the first is the default), hours and GPUs at most.
PARTITIONS = [p for p in setting("LABKIT_HUB_PARTITIONS", "debug").split(",") if p]
MAX_HOURS = int(setting("LABKIT_HUB_MAX_HOURS", "8"))
DEFAULT_HOURS = int(setting("LABKIT_HUB_DEFAULT_HOURS", "2"))
MAX_GPUS = int(setting("LABKIT_HUB_MAX_GPUS", "1"))
CPUS = setting("LABKIT_HUB_CPUS", "2")                               # per server; 4 makes notebooks 09-11 comfortable
MEMORY = setting("LABKIT_HUB_MEMORY", "")                            # e.g. "8G"; empty: the partition's default
ACCOUNT = setting("LABKIT_HUB_ACCOUNT", "")
RESERVATION = setting("LABKIT_HUB_RESERVATION", "")                  # the class's reservation, if any
# Who may log in: members of this Unix group (PAM). See the README for OAuth instead.
CLASS_GROUP = setting("LABKIT_HUB_GROUP", "labkit-class")
ADMINS = {u for u in setting("LABKIT_HUB_ADMINS", "").split(",") if u}
# Networking: students reach PUBLIC_URL; the compute nodes reach the hub's API at HUB_IP, an address of this host
# on the cluster network. By default the hub listens on 127.0.0.1 only, behind the site's TLS proxy (README). An
# https URL needs SSL_CERT and SSL_KEY. Plain http on any other address (passwords and cookies in clear) is refused
# unless ALLOW_PUBLIC_HTTP is "yes" (a closed network you trust, or a test cluster).
PUBLIC_URL = setting("LABKIT_HUB_BIND_URL", "http://127.0.0.1:8000")
SSL_CERT = setting("LABKIT_HUB_SSL_CERT", "")
SSL_KEY = setting("LABKIT_HUB_SSL_KEY", "")
ALLOW_PUBLIC_HTTP = setting("LABKIT_HUB_ALLOW_PUBLIC_HTTP", "") == "yes"
HUB_IP = setting("LABKIT_HUB_IP", "") or socket.gethostbyname(socket.gethostname())
STATE_DIR = setting("LABKIT_HUB_STATE_DIR", "/srv/jupyterhub")      # database, cookie secret (root only)
# The culler stops servers idle this long (seconds; no kernel or browser activity), which ends their jobs.
CULL_IDLE = int(setting("LABKIT_HUB_CULL_IDLE", "3600"))
CULL_EVERY = int(setting("LABKIT_HUB_CULL_EVERY", "300"))
# How the hub runs sbatch/squeue/scancel as the student. As root, sudo needs no rule; a non-root hub does (README).
EXEC_PREFIX = setting("LABKIT_HUB_EXEC_PREFIX", "sudo -E -u {username}")
START_TIMEOUT = int(setting("LABKIT_HUB_START_TIMEOUT", "300"))      # queue wait + start; a class fits in this

# ---- the hub -------------------------------------------------------------------------------------------------
def _loopback(host):
    """Whether ``host`` (from a URL; "" means every interface) is this machine's loopback only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind_url(url, cert, key, allow_public_http):
    """Refuse a public URL in clear, or https without its certificate; return the (scheme, host) it binds."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"LABKIT_HUB_BIND_URL must be an http:// or https:// URL, got {url!r}")
    host = parts.hostname or ""
    if parts.scheme == "https" and not (cert and key):
        raise ValueError("LABKIT_HUB_BIND_URL is https: set LABKIT_HUB_SSL_CERT and LABKIT_HUB_SSL_KEY too")
    if parts.scheme == "http" and not _loopback(host) and not allow_public_http:
        where = host or "every interface"
        raise ValueError(f"LABKIT_HUB_BIND_URL {url!r} serves plain http on {where}: passwords and cookies would "
                         "cross the network in clear. Listen on 127.0.0.1 behind a TLS proxy, use https with "
                         "LABKIT_HUB_SSL_CERT/_KEY, or set LABKIT_HUB_ALLOW_PUBLIC_HTTP=yes on a network you trust")
    return parts.scheme, host


check_bind_url(PUBLIC_URL, SSL_CERT, SSL_KEY, ALLOW_PUBLIC_HTTP)
c.JupyterHub.bind_url = PUBLIC_URL
if SSL_CERT:
    c.JupyterHub.ssl_cert = SSL_CERT
    c.JupyterHub.ssl_key = SSL_KEY
c.JupyterHub.hub_bind_url = f"http://{HUB_IP}:8081"
c.JupyterHub.hub_connect_ip = HUB_IP
os.makedirs(STATE_DIR, mode=0o700, exist_ok=True)
c.JupyterHub.db_url = f"sqlite:///{STATE_DIR}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = f"{STATE_DIR}/jupyterhub_cookie_secret"
c.JupyterHub.pid_file = f"{STATE_DIR}/jupyterhub.pid"
c.ConfigurableHTTPProxy.pid_file = f"{STATE_DIR}/jupyterhub-proxy.pid"
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:8001"
# npm's configurable-http-proxy if it is on PATH, else the pure-Python one installed beside this hub
c.ConfigurableHTTPProxy.command = [shutil.which("configurable-http-proxy")
                                   or os.path.join(os.path.dirname(sys.executable), "configurable-http-proxy")]
# Restarting the hub (a config change mid-class) must not end 30 students' sessions: the jobs keep running and
# the restarted hub finds them again (their job ids are in the database). Stop servers by hand before a shutdown.
c.JupyterHub.cleanup_servers = False

# ---- who may log in --------------------------------------------------------------------------------------------
# The default authenticator is PAM: the students' cluster accounts and passwords. Each must also have a home
# directory on the shared file system, since their server runs as them.
c.JupyterHub.authenticator_class = "pam"
c.LocalAuthenticator.allowed_groups = {CLASS_GROUP}
c.Authenticator.admin_users = ADMINS

# ---- the servers: Slurm jobs through batchspawner ---------------------------------------------------------------
c.JupyterHub.spawner_class = "batchspawner.SlurmSpawner"
c.SlurmSpawner.exec_prefix = EXEC_PREFIX
c.Spawner.start_timeout = START_TIMEOUT
c.Spawner.http_timeout = 120
c.SlurmSpawner.startup_poll_interval = 1.0
# The job gets only these variables (the hub's own PATH or PYTHONPATH mean nothing on a compute node); slurm/env.sh
# does the rest, exactly as for jupyter.sbatch, ddp.sbatch and deepspeed.sbatch.
c.Spawner.env_keep = ["LANG", "LC_ALL"]
c.Spawner.environment = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LABKIT_ROOT": LABKIT_ROOT,
    "LABKIT_ENV": LABKIT_ENV,
    "LABKIT_VENV": LABKIT_VENV,
    "LABKIT_CONDA_ENV": LABKIT_CONDA_ENV or "labkit",
    "LABKIT_MODULES": LABKIT_MODULES,
}
if os.environ.get("SLURM_CONF"):  # a slurm.conf outside /etc/slurm: sbatch, squeue and scancel need it
    c.Spawner.environment["SLURM_CONF"] = os.environ["SLURM_CONF"]
c.Spawner.cmd = ["jupyterhub-singleuser"]  # found on PATH once env.sh has activated the class environment
c.SlurmSpawner.batchspawner_singleuser_cmd = "batchspawner-singleuser"
c.SlurmSpawner.req_partition = PARTITIONS[0]
c.SlurmSpawner.req_runtime = f"{DEFAULT_HOURS:02d}:00:00"
c.SlurmSpawner.req_nprocs = CPUS
c.SlurmSpawner.req_memory = MEMORY
c.SlurmSpawner.req_account = ACCOUNT
c.SlurmSpawner.req_reservation = RESERVATION
c.SlurmSpawner.req_ngpus = "0"
c.SlurmSpawner.req_srun = "srun --export=ALL"  # the step gets what env.sh set up, not just --export's list
c.SlurmSpawner.batch_script = """#!/bin/bash
#SBATCH --job-name=labkit-hub
#SBATCH --output={{homedir}}/.labkit-hub-%j.log
#SBATCH --chdir={{homedir}}
#SBATCH --export={{keepvars}}
#SBATCH --get-user-env=L
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --partition={{partition}}
#SBATCH --time={{runtime}}
#SBATCH --cpus-per-task={{nprocs}}
{% if memory %}#SBATCH --mem={{memory}}
{% endif %}{% if ngpus and ngpus != "0" %}#SBATCH --gres=gpu:{{ngpus}}
{% endif %}{% if account %}#SBATCH --account={{account}}
{% endif %}{% if reservation %}#SBATCH --reservation={{reservation}}
{% endif %}
set -euo pipefail
trap 'echo "labkit-hub: SIGTERM (Stop, the idle culler or the time limit)"' TERM
# The workbook's environment, as every labkit job gets it (slurm/env.sh: venv, conda or modules).
source "${LABKIT_ROOT}/slurm/env.sh"
labkit_locate_root
labkit_activate
# Listen on this node's address only (batchspawner's default is every interface, 0.0.0.0).
bind="${LABKIT_JUPYTER_BIND:-$(hostname)}"
export JUPYTERHUB_SERVICE_URL="${JUPYTERHUB_SERVICE_URL/0.0.0.0/${bind}}"
# Runtime files and IPython's SQLite history on node-local storage, never on an NFS home (see jupyter.sbatch).
umask 077
local_dir="$(mktemp -d "${SLURM_TMPDIR:-${TMPDIR:-/tmp}}/labkit-hub-${SLURM_JOB_ID}.XXXXXX")"
trap 'rm -rf "${local_dir}"' EXIT
export JUPYTER_RUNTIME_DIR="${local_dir}/runtime" IPYTHONDIR="${local_dir}/ipython"
labkit_log "job ${SLURM_JOB_ID} on $(hostname): JupyterLab for ${USER:-$(id -un)} on ${bind}"
{{prologue}}
{% if srun %}{{srun}} {% endif %}{{cmd}}
{{epilogue}}
"""

# ---- the resource form ---------------------------------------------------------------------------------------
def labkit_options(raw):
    """Validate a server request (form or REST API) into the only keys the batch script reads.

    Anything else a client sends is dropped: batchspawner pastes user options into the batch script.
    """
    def one(key, default):
        value = raw.get(key, default)
        if isinstance(value, list):
            value = value[0] if value else default
        return str(value).strip()

    partition = one("partition", PARTITIONS[0])
    if partition not in PARTITIONS:
        raise ValueError(f"partition must be one of {', '.join(PARTITIONS)}, not {partition!r}")
    hours, gpus = one("hours", DEFAULT_HOURS), one("gpus", 0)
    if not re.fullmatch(r"\d{1,3}", hours) or not 1 <= int(hours) <= MAX_HOURS:
        raise ValueError(f"hours must be a whole number from 1 to {MAX_HOURS}, not {hours!r}")
    if not re.fullmatch(r"\d{1,2}", gpus) or not 0 <= int(gpus) <= MAX_GPUS:
        raise ValueError(f"GPUs must be a whole number from 0 to {MAX_GPUS}, not {gpus!r}")
    return {"partition": partition, "hours": int(hours), "gpus": int(gpus),
            "runtime": f"{int(hours):02d}:00:00", "ngpus": str(int(gpus))}


def _options_form(spawner):
    parts = "".join(f'<option value="{html.escape(p)}">{html.escape(p)}</option>' for p in PARTITIONS)
    hours = "".join(f'<option value="{h}"{" selected" if h == DEFAULT_HOURS else ""}>{h} h</option>'
                    for h in range(1, MAX_HOURS + 1))
    return f"""
<div class="form-group">
  <label for="labkit-partition">Partition</label>
  <select class="form-control" id="labkit-partition" name="partition">{parts}</select>
</div>
<div class="form-group">
  <label for="labkit-hours">Time (the server stops at the end; save your work)</label>
  <select class="form-control" id="labkit-hours" name="hours">{hours}</select>
</div>
<div class="form-group">
  <label for="labkit-gpus">GPUs (0: the notebooks run on {html.escape(CPUS)} CPU cores)</label>
  <input class="form-control" id="labkit-gpus" name="gpus" type="number" min="0" max="{MAX_GPUS}" value="0">
</div>
"""


c.Spawner.options_form = _options_form
c.Spawner.options_from_form = lambda formdata, spawner=None: labkit_options(formdata)


def _apply_user_options(spawner, user_options):
    # A REST API request bypasses the form: validate here too, and keep only what the form offers.
    from tornado.web import HTTPError

    try:
        spawner.user_options = labkit_options(user_options or {})
    except ValueError as exc:
        raise HTTPError(400, str(exc)) from None


c.Spawner.apply_user_options = _apply_user_options

# ---- the workbook in each home: nbgitpuller -----------------------------------------------------------------------
if WORKBOOK_REPO:
    c.Spawner.default_url = "/git-pull?" + urlencode({
        "repo": WORKBOOK_REPO, "branch": WORKBOOK_BRANCH, "targetpath": "labkit",
        "urlpath": f"lab/tree/labkit/{FIRST_NOTEBOOK}"})
else:
    c.Spawner.default_url = "/lab"

# ---- the idle culler --------------------------------------------------------------------------------------------
c.JupyterHub.services = [{
    "name": "idle-culler",
    "command": [sys.executable, "-m", "jupyterhub_idle_culler", f"--timeout={CULL_IDLE}",
                f"--cull-every={CULL_EVERY}"],
}]
c.JupyterHub.load_roles = [{
    "name": "idle-culler",
    "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
    "services": ["idle-culler"],
}]
