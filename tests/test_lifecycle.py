"""labkit.lifecycle: checkpoint writes really reach the disk and leave nothing behind; Young's rule; manifests."""

from __future__ import annotations

import hashlib
import io
import json
import math

import pytest
import torch

from labkit import lifecycle as L


def test_checkpoint_writes_report_sizes_and_clean_up(tmp_path):
    (tmp_path / "keep.txt").write_text("the user's file")
    pts = L.time_checkpoint_writes([4096, 2**20], tmp_path, repeats=2)
    assert [p.payload_bytes for p in pts] == [4096, 2**20]
    assert all(p.payload_bytes < p.file_bytes < p.payload_bytes + 4096 and p.seconds > 0 for p in pts)
    assert pts[1].bytes_per_s == pts[1].file_bytes / pts[1].seconds
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"], "only its own temporary folder is removed"


def test_a_checkpoint_file_holds_what_was_written(tmp_path):
    """The file size reported is torch.save's real size for the same payload."""
    (pt,) = L.time_checkpoint_writes([4000], tmp_path, repeats=1, fsync=False)
    buf = io.BytesIO()
    torch.save({"weights": torch.ones(1000)}, buf)  # to a file object, as time_checkpoint_writes does
    assert pt.file_bytes == len(buf.getvalue())


def test_checkpoint_writes_check_arguments(tmp_path):
    with pytest.raises(TypeError):
        L.time_checkpoint_writes([4096], str(tmp_path))
    with pytest.raises(ValueError):
        L.time_checkpoint_writes([4096], tmp_path / "missing")
    with pytest.raises(ValueError):
        L.time_checkpoint_writes([2**31], tmp_path)
    with pytest.raises(TypeError):
        L.time_checkpoint_writes([4096], tmp_path, fsync=1)


def test_young_interval_minimises_the_expected_waste():
    c, m = 60.0, 86400.0
    best = L.young_interval(c, m)

    def waste(t):  # writing time per unit of work + work lost per unit of work
        return c / t + t / (2 * m)

    assert best == pytest.approx(math.sqrt(2 * c * m))
    assert waste(best) < waste(0.8 * best) and waste(best) < waste(1.25 * best)
    assert L.checkpoint_overhead(60, 540) == pytest.approx(0.1)
    for bad in (0, -1, math.inf, math.nan):
        with pytest.raises(ValueError):
            L.young_interval(bad, 10)
    with pytest.raises(TypeError):
        L.checkpoint_overhead("60", 10)


def test_fingerprint_is_content_dtype_and_shape():
    a = torch.arange(6)
    assert L.fingerprint(a) == L.fingerprint(torch.arange(6))
    assert L.fingerprint(a) != L.fingerprint(a.reshape(2, 3)) != L.fingerprint(a.float())
    b = a.clone()
    b[3] = 7
    assert L.fingerprint(a) != L.fingerprint(b)
    h = hashlib.sha256(b"torch.int64(6,);" + a.numpy().tobytes()).hexdigest()
    assert L.fingerprint(a) == h
    assert L.fingerprint(torch.zeros(0)) and L.fingerprint(torch.tensor([True, False]))
    with pytest.raises(ValueError):
        L.fingerprint()
    with pytest.raises(TypeError):
        L.fingerprint([1, 2])


def test_manifest_finds_changed_missing_and_escaping_files(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"abc")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("x")
    path = L.write_manifest(tmp_path, {"seed": 0})
    doc = json.loads(path.read_text())
    assert doc["meta"] == {"seed": 0} and set(doc["files"]) == {"a.bin", "sub/b.txt"}
    assert doc["files"]["a.bin"] == {"sha256": hashlib.sha256(b"abc").hexdigest(), "bytes": 3}
    assert L.verify_manifest(tmp_path) == []
    (tmp_path / "a.bin").write_bytes(b"abd")
    (tmp_path / "sub" / "b.txt").unlink()
    assert L.verify_manifest(tmp_path) == ["a.bin: changed (sha256 differs)", "sub/b.txt: missing"]
    doc["files"]["../outside"] = {"sha256": "0", "bytes": 0}
    path.write_text(json.dumps(doc))
    assert "../outside: outside the run folder" in L.verify_manifest(tmp_path)
    with pytest.raises(ValueError):
        L.write_manifest(tmp_path, {"x": object()})
    with pytest.raises(ValueError):
        L.verify_manifest(tmp_path / "sub")
