"""labkit.slurm: the #SBATCH header, time-limit and ssh-tunnel parsers (no Slurm needed).

tests/slurm/test_exercises_nb10.py compares the header parser with a real sbatch where one can run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from labkit import slurm

ROOT = Path(__file__).resolve().parents[1]


def test_parse_sbatch_header_forms():
    text = """#!/bin/bash
# a comment
#SBATCH -N 2 --ntasks-per-node=4
#SBATCH --job-name "my job"   # trailing comment
#SBATCH -t1:30:00
#SBATCH --exclusive
#SBATCH --gres=gpu:a100:4

echo start
#SBATCH --job-name=ignored
"""
    o = slurm.parse_sbatch_header(text)
    assert o == {"nodes": "2", "ntasks-per-node": "4", "job-name": "my job", "time": "1:30:00",
                 "exclusive": "", "gres": "gpu:a100:4"}
    assert slurm.gpus_per_node(o) == 4
    assert slurm.gpus_per_node({"gpus-per-node": "h100:8"}) == 8
    assert slurm.gpus_per_node({"gres": "gpu"}) == 1 and slurm.gpus_per_node({}) is None
    with pytest.raises(TypeError):
        slurm.parse_sbatch_header(None)
    with pytest.raises(ValueError, match="not an sbatch option"):
        slurm.parse_sbatch_header("#SBATCH nodes=2\n")
    with pytest.raises(ValueError, match="needs a value"):
        slurm.parse_sbatch_header("#SBATCH -N\n")


@pytest.mark.parametrize("value,minutes", [("90", 90), ("1:30:00", 90), ("05:30", 5.5), ("1-12", 2160),
                                           ("2-00:30", 2910), ("0-01:00:30", 60.5)])
def test_time_minutes(value, minutes):
    assert slurm.time_minutes(value) == minutes


def test_time_minutes_rejects_bad_input():
    with pytest.raises(ValueError, match="not a Slurm time"):
        slurm.time_minutes("1h30")
    with pytest.raises(TypeError):
        slurm.time_minutes(90)


def test_parse_tunnel():
    t = slurm.parse_tunnel("ssh -N -L 8899:gpu017:24817 alice@login.hpc.example")
    assert t == {"local_port": 8899, "host": "gpu017", "port": 24817, "dest_user": "alice",
                 "dest_host": "login.hpc.example", "jump": None, "no_shell": True}
    t = slurm.parse_tunnel("ssh -J alice@login -L 127.0.0.1:1:gpu017:2 alice@gpu017")
    assert (t["jump"], t["dest_host"], t["local_port"], t["no_shell"]) == ("alice@login", "gpu017", 1, False)
    for bad in ("scp a b", "ssh alice@login", "ssh -L 1:a:2 -L 3:b:4 x", "ssh -L a:b:c x", "ssh -L 1:a:2"):
        with pytest.raises(ValueError):
            slurm.parse_tunnel(bad)
    with pytest.raises(TypeError):
        slurm.parse_tunnel(None)


def test_the_workbook_scripts_parse():
    for name in ("jupyter.sbatch", "ddp.sbatch", "deepspeed.sbatch"):
        o = slurm.parse_sbatch_header((ROOT / "slurm" / name).read_text())
        assert re.fullmatch(r"B:(TERM|USR1)@\d+", o["signal"]) and slurm.time_minutes(o["time"]) > 0
        assert "account" not in o and "partition" not in o  # site specific: on the command line


def test_public_api_is_documented():
    assert slurm.__all__ == sorted(slurm.__all__)
    for name in slurm.__all__:
        doc = getattr(slurm, name).__doc__
        assert doc and doc.rstrip().endswith("Introduced in notebook 12."), name
