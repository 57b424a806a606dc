# shellcheck shell=bash
# slurm/env.sh: the ONE place that says how a job gets its Python environment.
#
# Sourced by jupyter.sbatch, ddp.sbatch and deepspeed.sbatch (never run on its own). Every setting is
# ${VAR:-default}, so you change it when you submit, without editing any file:
#
#   sbatch slurm/jupyter.sbatch                                   # auto: ./.venv if present, else PATH
#   LABKIT_ENV=conda LABKIT_CONDA_ENV=labkit sbatch slurm/jupyter.sbatch
#   LABKIT_ENV=module LABKIT_MODULES="python/3.11 cuda/12.4" sbatch slurm/ddp.sbatch
#   LABKIT_MODULES="cuda/12.4" LABKIT_VENV=/project/me/venvs/labkit sbatch slurm/ddp.sbatch
#
# sbatch passes your current environment to the job (--export=ALL, Slurm's default), which is what
# carries these variables. No account, partition or personal path is written here.

# the workbook checkout; empty: found from the submitted script's path or the submit folder
LABKIT_ROOT="${LABKIT_ROOT:-}"
# how to get Python: auto, venv, conda, module or none (auto: a venv if there, else conda)
LABKIT_ENV="${LABKIT_ENV:-auto}"
# a virtual environment (python -m venv); empty: $LABKIT_ROOT/.venv
LABKIT_VENV="${LABKIT_VENV:-}"
# a conda environment, by name or path (see environment.yml)
LABKIT_CONDA_ENV="${LABKIT_CONDA_ENV:-labkit}"
# modules to load first, space separated, e.g. "python/3.11 cuda/12.4"; empty: none
LABKIT_MODULES="${LABKIT_MODULES:-}"

labkit_log() {
    # One line to the job's output, prefixed with the time and the script's name.
    printf '[%(%H:%M:%S)T labkit] %s\n' -1 "$*"
}

labkit_die() {
    labkit_log "ERROR: $*" >&2
    exit 1
}

labkit_locate_root() {
    # Set LABKIT_ROOT to the workbook checkout. sbatch runs a *copy* of the script from its spool
    # directory, so $0 does not help: use Slurm's record of the submitted script's path, then the
    # directory sbatch was called from.
    local cmd dir
    if [[ -n "${LABKIT_ROOT}" ]]; then
        [[ -d "${LABKIT_ROOT}/slurm" ]] || labkit_die "LABKIT_ROOT=${LABKIT_ROOT} has no slurm/ folder"
        return 0
    fi
    if [[ -n "${SLURM_JOB_ID:-}" ]] && command -v scontrol >/dev/null 2>&1; then
        cmd="$(scontrol show job -o "${SLURM_JOB_ID}" 2>/dev/null | sed -n 's/.* Command=\([^ ]*\).*/\1/p')"
        dir="$(dirname "$(dirname "${cmd:-/nonexistent/x}")")"
        if [[ -f "${dir}/slurm/env.sh" ]]; then
            LABKIT_ROOT="${dir}"
            return 0
        fi
    fi
    for dir in "${SLURM_SUBMIT_DIR:-}" "${PWD}"; do
        if [[ -n "${dir}" && -f "${dir}/slurm/env.sh" ]]; then
            LABKIT_ROOT="${dir}"
            return 0
        fi
    done
    labkit_die "cannot find the workbook: submit from its root (sbatch slurm/...) or set LABKIT_ROOT"
}

labkit_load_modules() {
    # Load LABKIT_MODULES with Lmod or Environment Modules, initialising `module` if the batch shell
    # lacks it (a non-login bash does not read /etc/profile).
    local init
    [[ -n "${LABKIT_MODULES}" ]] || return 0
    if ! type module >/dev/null 2>&1; then
        for init in /etc/profile.d/lmod.sh /etc/profile.d/modules.sh /usr/share/lmod/lmod/init/bash; do
            if [[ -f "${init}" ]]; then
                # shellcheck disable=SC1090
                source "${init}"
                break
            fi
        done
    fi
    type module >/dev/null 2>&1 || labkit_die "LABKIT_MODULES is set but this node has no 'module' command"
    # shellcheck disable=SC2086  # word splitting is wanted: one module per word
    module load ${LABKIT_MODULES} || labkit_die "module load ${LABKIT_MODULES} failed"
}

labkit_activate() {
    # Activate the environment chosen by LABKIT_ENV, then check that labkit imports.
    local kind="${LABKIT_ENV}" conda_exe
    [[ -n "${LABKIT_VENV}" ]] || LABKIT_VENV="${LABKIT_ROOT}/.venv"
    labkit_load_modules
    if [[ "${kind}" == auto ]]; then
        if [[ -f "${LABKIT_VENV}/bin/activate" ]]; then
            kind=venv
        elif [[ -n "${CONDA_EXE:-}" ]] || command -v conda >/dev/null 2>&1; then
            kind=conda
        elif [[ -n "${LABKIT_MODULES}" ]]; then
            kind=module
        else
            kind=none
        fi
    fi
    case "${kind}" in
        venv)
            [[ -f "${LABKIT_VENV}/bin/activate" ]] || labkit_die "no virtual environment at LABKIT_VENV=${LABKIT_VENV}"
            # shellcheck disable=SC1091
            source "${LABKIT_VENV}/bin/activate"
            ;;
        conda)
            conda_exe="${CONDA_EXE:-$(command -v conda || true)}"
            [[ -n "${conda_exe}" ]] || labkit_die "LABKIT_ENV=conda but no conda on PATH (load a module first?)"
            eval "$("${conda_exe}" shell.bash hook)"
            conda activate "${LABKIT_CONDA_ENV}" || labkit_die "conda activate ${LABKIT_CONDA_ENV} failed"
            ;;
        module | none) ;;
        *) labkit_die "LABKIT_ENV must be auto, venv, conda, module or none, not '${kind}'" ;;
    esac
    command -v python >/dev/null 2>&1 || labkit_die "no python after activating '${kind}'"
    # From / : in the checkout, `import labkit` would find ./labkit even where it is not installed.
    (cd / && python -c 'import labkit') 2>/dev/null || labkit_die "python ($(command -v python)) cannot import labkit; in a class, set LABKIT_VENV (or LABKIT_ENV) to the class environment your instructor gave you; in your own checkout: pip install -e ${LABKIT_ROOT}"
    labkit_log "environment: ${kind} ($(command -v python))"
}

labkit_free_port() {
    # Print a TCP port that nothing on this node holds now: random in [min, max], checked by binding.
    # Usage: labkit_free_port [host] [min] [max]. A race with another job stays possible, so callers
    # still retry (JupyterLab's --port-retries, torchrun's rendezvous error).
    python - "${1:-}" "${2:-20000}" "${3:-29999}" <<'PY'
import random, socket, sys
host, lo, hi = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for _ in range(200):
    port = random.SystemRandom().randint(lo, hi)
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            continue
    print(port)
    break
else:
    sys.exit(f"no free port in {lo}-{hi} after 200 tries")
PY
}
