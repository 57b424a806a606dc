"""Reading Slurm inputs the way Slurm does: a batch script's ``#SBATCH`` header, time limits, ssh tunnels.

``parse_sbatch_header`` reads a batch script's ``#SBATCH`` lines the way sbatch does (the tests compare
it with a real sbatch), ``time_minutes`` converts a Slurm time limit, ``gpus_per_node`` reads the GPUs a
header asks for on each node, and ``parse_tunnel`` reads an ``ssh -L`` command. Notebook 12 uses them to
read the workbook's own slurm/ scripts and to grade its exercises (:mod:`labkit.exercises.nb12`).
Pure Python: importing this module loads neither torch nor a GPU library.

Introduced in notebook 12.
"""

from __future__ import annotations

import re
import shlex

from labkit._validate import safe_repr

__all__ = ["gpus_per_node", "parse_sbatch_header", "parse_tunnel", "time_minutes"]

_SHORT = {"-N": "nodes", "-n": "ntasks", "-c": "cpus-per-task", "-t": "time", "-p": "partition",
          "-A": "account", "-J": "job-name", "-o": "output", "-e": "error", "-G": "gpus", "-q": "qos",
          "-w": "nodelist", "-C": "constraint", "-D": "chdir", "-a": "array"}
_FLAGS = {"exclusive", "requeue", "no-requeue", "wait", "overcommit", "test-only", "parsable"}


def parse_sbatch_header(text: str) -> dict[str, str]:
    """Return the options of a batch script's ``#SBATCH`` lines as {long option name: value}.

    Like sbatch, it reads ``#SBATCH`` lines only until the first line that is neither blank nor a
    comment; later ones are ignored. Short options become long ones (``-N 2`` -> ``nodes: "2"``),
    ``# ...`` after an option is a comment, and flags get ``""``. A later repeat overrides an earlier
    one. Raises ValueError for a line it cannot read and TypeError if ``text`` is not a str.
    Introduced in notebook 12.
    """
    if not isinstance(text, str):
        raise TypeError(f"expected the script as a str, got {type(text).__name__}")
    opts: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or (line.startswith("#") and not line.startswith("#SBATCH")):
            continue
        if not line.startswith("#SBATCH"):
            break  # the first command ends the header: sbatch ignores any #SBATCH line after it
        body = re.sub(r"\s+#.*$", "", line[len("#SBATCH"):]).strip()
        try:
            words = shlex.split(body)
        except ValueError as exc:
            raise ValueError(f"line {lineno}: cannot read {safe_repr(raw)}: {exc}") from None
        i = 0
        while i < len(words):
            w = words[i]
            if w.startswith("--"):
                name, eq, value = w[2:].partition("=")
                if not eq and name not in _FLAGS and i + 1 < len(words) and not words[i + 1].startswith("-"):
                    value, i = words[i + 1], i + 1
            elif w[:2] in _SHORT:
                name, value = _SHORT[w[:2]], w[2:].lstrip("=")
                if not value:
                    if i + 1 >= len(words):
                        raise ValueError(f"line {lineno}: option {w} needs a value")
                    value, i = words[i + 1], i + 1
            else:
                raise ValueError(f"line {lineno}: {safe_repr(w)} is not an sbatch option")
            if not name:
                raise ValueError(f"line {lineno}: empty option in {safe_repr(raw)}")
            opts[name] = value
            i += 1
    return opts


def time_minutes(value: str) -> float:
    """Convert a Slurm time limit (``60``, ``1:00:00``, ``1-12``, ``2-00:30:00`` ...) to minutes.

    Introduced in notebook 12.
    """
    if not isinstance(value, str):
        raise TypeError(f"expected a time string such as '01:30:00', got {type(value).__name__}")
    v = value.strip()
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", v)
    if not m:
        raise ValueError(f"{safe_repr(value)} is not a Slurm time: use minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS")
    days, a, b, c = m.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        return int(days) * 1440 + int(a) * 60 + int(b or 0) + int(c or 0) / 60
    if c is not None:  # HH:MM:SS
        return int(a) * 60 + int(b) + int(c) / 60
    if b is not None:  # MM:SS
        return int(a) + int(b) / 60
    return float(int(a))


def gpus_per_node(opts: dict[str, str]) -> int | None:
    """GPUs per node that parsed options ask for (``--gpus-per-node`` or ``--gres=gpu[:type]:N``).

    Returns None when neither is given. Introduced in notebook 12.
    """
    if not isinstance(opts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in opts.items()):
        raise TypeError("opts must be a dict of option name to value, both str (parse_sbatch_header's result)")
    if "gpus-per-node" in opts:
        return int(opts["gpus-per-node"].split(":")[-1])
    for item in opts.get("gres", "").split(","):
        parts = item.split(":")
        if parts[0] == "gpu":
            return int(parts[-1]) if len(parts) > 1 and parts[-1].isdigit() else 1
    return None


def parse_tunnel(command: str) -> dict[str, object]:
    """Read an ``ssh ... -L [bind:]lport:host:port ... dest`` command into its parts.

    Returns {"local_port", "host", "port", "dest_user", "dest_host", "jump", "no_shell"}.
    Raises ValueError if it is not an ssh command with exactly one -L forward.
    Introduced in notebook 12.
    """
    if not isinstance(command, str):
        raise TypeError(f"expected the command as a str, got {type(command).__name__}")
    words = shlex.split(command)
    if not words or words[0] != "ssh":
        raise ValueError("the command must start with ssh")
    forwards, jump, dest, no_shell = [], None, None, False
    i = 1
    while i < len(words):
        w = words[i]
        if w in ("-L", "-J", "-p", "-i", "-l", "-o"):
            if i + 1 >= len(words):
                raise ValueError(f"{w} needs a value")
            if w == "-L":
                forwards.append(words[i + 1])
            elif w == "-J":
                jump = words[i + 1]
            i += 2
            continue
        if w.startswith("-L") and len(w) > 2:
            forwards.append(w[2:])
        elif w.startswith("-J") and len(w) > 2:
            jump = w[2:]
        elif w.startswith("-") and not w.startswith("--"):
            no_shell = no_shell or "N" in w[1:]
        elif dest is None:
            dest = w
        i += 1
    if len(forwards) != 1:
        raise ValueError(f"expected one -L forward, found {len(forwards)}")
    parts = forwards[0].split(":")
    if len(parts) == 4:
        parts = parts[1:]
    if len(parts) != 3 or not parts[0].isdigit() or not parts[2].isdigit():
        raise ValueError(f"-L {forwards[0]} is not local_port:host:port")
    if dest is None:
        raise ValueError("no destination (user@host) in the command")
    user, _, host = dest.rpartition("@")
    return {"local_port": int(parts[0]), "host": parts[1], "port": int(parts[2]), "dest_user": user or None,
            "dest_host": host, "jump": jump, "no_shell": no_shell}
