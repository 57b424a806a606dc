"""labkit.train checkpoints are safe to load from shared storage: weights_only, a sha256 header, checked keys
and types, and one clear error (CheckpointError, naming the file) for every bad file. Also a source scan:
nothing in labkit may call torch.load without weights_only=True, or unpickle with pickle & co."""

from __future__ import annotations

import ast
import hashlib
import io
import os
import pickle
import random
from pathlib import Path

import pytest
import torch

from labkit import data, models, train
from labkit.train import CheckpointError

LABKIT = Path(train.__file__).resolve().parent


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def task():
    return data.make_token_task("reverse", n=256, n_digits=4, vocab_size=8, seed=0)


def _model(task):
    return models.TinyGPT(vocab_size=task.vocab_size, seq_len=task.seq_len, d_model=32, n_layers=1, n_heads=2,
                          seed=0)


def _run(task, **kw):
    return train.train(_model(task), data.Batches(task.inputs, task.targets, batch_size=16, seed=0),
                       device="cpu", progress=False, **kw)


@pytest.fixture(scope="module")
def good(task, tmp_path_factory) -> bytes:
    """The bytes of a real checkpoint: fp16 with a GradScaler, so every entry is filled in."""
    d = tmp_path_factory.mktemp("good")
    _run(task, policy="fp16", steps=3, checkpoint_dir=d, checkpoint_every=3,
         scaler_kwargs={"init_scale": 2.0**10, "growth_interval": 2})
    return (d / train.CHECKPOINT_NAME).read_bytes()


def _with_header(payload: bytes) -> bytes:
    """What an attacker who knows the format writes: a correct header in front of any payload."""
    digest = hashlib.sha256(payload).hexdigest()
    return f"LABKIT-CHECKPOINT v1 sha256={digest} bytes={len(payload)}\n".encode() + payload


def _torch_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _payload(blob: bytes) -> bytes:
    return blob[blob.index(b"\n") + 1:]


class _Evil:
    """Unpickling this runs a shell command that creates a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


# ------------------------------------------------------------------------------ good checkpoints

def test_real_checkpoint_round_trips_with_weights_only(good, tmp_path):
    assert good.startswith(b"LABKIT-CHECKPOINT v1 sha256=")
    path = tmp_path / "last.pt"
    path.write_bytes(good)
    state = train.load_checkpoint(path)
    assert state["step"] == 3 and state["policy"] == "fp16"
    assert set(state) == {"step", "policy", "model", "optimizer", "scaler", "rng_cpu", "rng_device", "history"}
    assert state["scaler"]["scale"] == 2.0**10 * 2 and state["rng_device"] is None
    assert state["history"]["steps"] == [0, 1, 2] and all(isinstance(x, bool) for x in state["history"]["skipped"])
    # the payload itself is an ordinary torch file that the safe loader reads
    again = torch.load(io.BytesIO(_payload(good)), weights_only=True)
    assert torch.equal(again["rng_cpu"], state["rng_cpu"])


def test_save_converts_numpy_and_tensor_scalars_in_history(task, tmp_path):
    np = pytest.importorskip("numpy")
    r = _run(task, steps=1)
    path = train.save_checkpoint(tmp_path / "h.pt", step=1, model=r.model, optimizer=r.optimizer, scaler=None,
                                 policy="fp32", history={"loss": [np.float32(0.5), torch.tensor(0.25), 1, None]})
    assert train.load_checkpoint(path)["history"] == {"loss": [0.5, 0.25, 1, None]}


def test_save_refuses_what_weights_only_could_not_load(task, tmp_path):
    r = _run(task, steps=1)
    kw = {"model": r.model, "optimizer": r.optimizer, "scaler": None, "policy": "fp32"}
    with pytest.raises(ValueError, match="step"):
        train.save_checkpoint(tmp_path / "a.pt", step=-1, **kw)
    with pytest.raises(TypeError, match="policy"):
        train.save_checkpoint(tmp_path / "a.pt", step=1, **{**kw, "policy": 3})
    with pytest.raises(TypeError, match="history"):
        train.save_checkpoint(tmp_path / "a.pt", step=1, history={"loss": [object()]}, **kw)
    r.optimizer.param_groups[0]["schedule"] = lambda s: s  # an optimizer extra that only pickle could store
    with pytest.raises(TypeError, match=r"optimizer.*function"):
        train.save_checkpoint(tmp_path / "a.pt", step=1, **kw)
    assert list(tmp_path.iterdir()) == []  # refused before any file was written


def test_resume_from_a_corrupted_checkpoint_fails_clearly(task, tmp_path):
    _run(task, steps=2, checkpoint_dir=tmp_path, checkpoint_every=2)
    path = tmp_path / train.CHECKPOINT_NAME
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 0x01
    path.write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="checksum") as info:
        _run(task, steps=4, checkpoint_dir=tmp_path, resume=True)
    assert str(path) in str(info.value)


# ------------------------------------------------------------------------------ bad checkpoints

def _flip(blob: bytes, where: int) -> bytes:
    b = bytearray(blob)
    b[where] ^= 0x10
    return bytes(b)


def _state(good: bytes) -> dict:
    return torch.load(io.BytesIO(_payload(good)), weights_only=True)


def _altered(good: bytes, **entries) -> bytes:
    """A real checkpoint with some entries replaced, under a correct header."""
    return _with_header(_torch_bytes({**_state(good), **entries}))


BAD = {
    "empty": lambda g, m: b"",
    "truncated": lambda g, m: g[: len(g) // 2],
    "truncated header": lambda g, m: g[:30],
    "one byte short": lambda g, m: g[:-1],
    "extra bytes": lambda g, m: g + b"\0",
    "random bytes": lambda g, m: random.Random(0).randbytes(4096),
    "flipped payload byte": lambda g, m: _flip(g, len(g) - 1000),
    "flipped header byte": lambda g, m: _flip(g, 40),
    "no header (torch.save of a real state)": lambda g, m: _torch_bytes(_state(g)),
    "future format": lambda g, m: g.replace(b"LABKIT-CHECKPOINT v1 ", b"LABKIT-CHECKPOINT v9 ", 1),
    "missing key": lambda g, m: _with_header(_torch_bytes({k: v for k, v in _state(g).items() if k != "history"})),
    "wrong type": lambda g, m: _with_header(_torch_bytes({**_state(g), "step": "3"})),
    "wrong nested type": lambda g, m: _with_header(_torch_bytes({**_state(g), "model": [1, 2]})),
    "not a dict": lambda g, m: _with_header(_torch_bytes([1, 2, 3])),
    "7-byte CPU RNG state": lambda g, m: _altered(g, rng_cpu=torch.zeros(7, dtype=torch.uint8)),
    "one byte more CPU RNG state": lambda g, m: _altered(g, rng_cpu=torch.zeros(5057, dtype=torch.uint8)),
    "int64 CPU RNG state": lambda g, m: _altered(g, rng_cpu=_state(g)["rng_cpu"].long()),
    "float device RNG state": lambda g, m: _altered(g, rng_device=torch.zeros(16)),
    "malicious raw pickle": lambda g, m: pickle.dumps(_Evil(m)),
    "malicious pickle with a valid header": lambda g, m: _with_header(pickle.dumps(_Evil(m))),
    "malicious torch.save with a valid header": lambda g, m: _with_header(_torch_bytes({**_state(g), "step": _Evil(m)})),
}


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")  # torch notes the crafted pickle
@pytest.mark.parametrize("kind", list(BAD))
def test_every_bad_checkpoint_raises_checkpoint_error_naming_the_file(kind, good, tmp_path):
    marker = tmp_path / "PWNED"
    path = tmp_path / "last.pt"
    path.write_bytes(BAD[kind](good, marker))
    with pytest.raises(CheckpointError) as info:
        train.load_checkpoint(path)
    err = info.value
    assert isinstance(err, ValueError) and err.path == path
    msg = str(err)
    assert str(path) in msg and "Delete it" in msg and "start fresh" in msg
    assert "weights_only=False" not in msg  # never advise the unsafe load
    assert not marker.exists(), "the checkpoint ran code"


def test_a_crafted_history_sets_only_the_per_step_lists(good, task, tmp_path):
    """History keys named like other TrainResult fields (model, policy, device...) never set them on resume."""
    state = _state(good)
    state["history"] = {**state["history"], "model": [1.0], "policy": [2], "device": [3], "checkpoint": [4],
                        "peak_memory": [5], "memory_source": [6]}
    (tmp_path / train.CHECKPOINT_NAME).write_bytes(_with_header(_torch_bytes(state)))
    r = _run(task, policy="fp16", steps=4, checkpoint_dir=tmp_path, resume=True,
             scaler_kwargs={"init_scale": 2.0**10, "growth_interval": 2})
    assert isinstance(r.model, torch.nn.Module) and r.policy == "fp16" and r.device == "cpu"
    assert isinstance(r.memory_source, str) and r.resumed_from == 3 and r.steps == [0, 1, 2, 3]
    assert set(r.history()) == {"steps", "loss", "grad_norm", "scale", "skipped", "step_time"}


def test_the_malicious_payload_is_real(tmp_path):
    """The payload the tests feed load_checkpoint does run code when unpickled the unsafe way."""
    marker = tmp_path / "PWNED"
    pickle.loads(pickle.dumps(_Evil(marker)))  # on purpose: proves the payload is live
    assert marker.exists()


def test_missing_file_and_bad_path_type():
    with pytest.raises(FileNotFoundError):
        train.load_checkpoint("/no/such/dir/last.pt")
    with pytest.raises(TypeError):
        train.load_checkpoint(3)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ a source scan of labkit

_PICKLE_MODULES = {"pickle", "_pickle", "cPickle", "dill", "cloudpickle", "joblib", "marshal", "shelve"}
_PICKLE_NAMES = {"load", "loads", "Unpickler", "open"}
_TORCH_LOADS = {"torch.load", "torch.serialization.load"}


def unsafe_loads(source: str, filename: str = "<src>") -> list[str]:
    """Return ``file:line: what`` for each torch.load without weights_only=True and each pickle-style load."""
    tree = ast.parse(source, filename)
    alias: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                alias[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                alias[a.asname or a.name] = f"{node.module}.{a.name}"

    def dotted(node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return alias.get(node.id)
        if isinstance(node, ast.Attribute):
            base = dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    safe_funcs = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and dotted(node.func) in _TORCH_LOADS:
            kw = {k.arg: k.value for k in node.keywords}
            ok = isinstance(kw.get("weights_only"), ast.Constant) and kw["weights_only"].value is True
            if ok:
                safe_funcs.add(id(node.func))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Name, ast.Attribute)):
            continue
        name = dotted(node)
        if name is None:
            continue
        if name in _TORCH_LOADS and id(node) not in safe_funcs:
            found.append(f"{filename}:{node.lineno}: {name} without weights_only=True")
        head, _, last = name.rpartition(".")
        if head in _PICKLE_MODULES and last in _PICKLE_NAMES:
            found.append(f"{filename}:{node.lineno}: {name} (unpickling runs code)")
    for node in ast.walk(tree):  # `from torch import load` / `from pickle import loads` themselves
        if isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if full in _TORCH_LOADS or (node.module in _PICKLE_MODULES and a.name in _PICKLE_NAMES):
                    found.append(f"{filename}:{node.lineno}: imports {full}")
    return sorted(set(found))


@pytest.mark.parametrize("src", [
    "import torch\ntorch.load(p)",
    "import torch\ntorch.load(p, weights_only=False)",
    "import torch as T\nT.load(p, map_location='cpu')",
    "import torch\ntorch.serialization.load(p)",
    "from torch import load\nload(p, weights_only=True)",
    "import torch\nf = torch.load\nf(p, weights_only=True)",
    "import pickle\npickle.loads(b)",
    "import pickle as pk\npk.load(fh)",
    "from pickle import loads\nloads(b)",
    "import _pickle\n_pickle.Unpickler(fh).load()",
    "import torch\ntorch.load(p, weights_only=flag)",
])
def test_scanner_catches_unsafe_loads(src):
    assert unsafe_loads(src), src


@pytest.mark.parametrize("src", [
    "import torch\ntorch.load(p, map_location='cpu', weights_only=True)",
    "import torch\ntorch.save(x, p)",
    "import pickle\npickle.dumps(x)",
    "import json\njson.loads(s)",
])
def test_scanner_passes_safe_code(src):
    assert unsafe_loads(src) == []


def test_labkit_never_loads_unsafely():
    files = sorted(LABKIT.rglob("*.py"))
    assert len(files) > 20 and LABKIT / "train.py" in files
    found = [hit for f in files for hit in unsafe_loads(f.read_text(), str(f.relative_to(LABKIT.parent)))]
    assert found == []
