"""Tests for labkit.data: seeded synthetic tasks and step-addressed batches."""

from __future__ import annotations

import pytest
import torch

from labkit import data


def test_regression_is_seeded_and_shaped():
    x1, y1 = data.make_regression(128, 8, 2, seed=3)
    x2, y2 = data.make_regression(128, 8, 2, seed=3)
    x3, _ = data.make_regression(128, 8, 2, seed=4)
    assert x1.shape == (128, 8) and y1.shape == (128, 2)
    assert x1.dtype == y1.dtype == torch.float32
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(x1, x3)


def test_regression_target_scale_scales_targets():
    _, y1 = data.make_regression(64, 4, seed=0, target_scale=1.0)
    _, y2 = data.make_regression(64, 4, seed=0, target_scale=1e-3)
    torch.testing.assert_close(y2, y1 * 1e-3)


def test_classification_labels_cover_classes():
    x, y = data.make_classification(1000, 8, 5, seed=0)
    assert x.shape == (1000, 8) and y.dtype == torch.long
    assert set(y.tolist()) == set(range(5))


@pytest.mark.parametrize("task", sorted(data.TOKEN_TASKS))
def test_token_task_shapes_and_targets_shift_inputs(task):
    t = data.make_token_task(task, n=64, n_digits=5, vocab_size=10, seed=1)
    assert t.inputs.shape == t.targets.shape == (64, 10) and t.seq_len == 10
    assert int(t.inputs.max()) < t.vocab_size
    mask = t.targets != data.IGNORE_INDEX
    # the target at t is the input at t+1 wherever both exist
    assert torch.equal(t.targets[:, :-1][mask[:, :-1]], t.inputs[:, 1:][mask[:, :-1]])


def test_reverse_task_answers_are_the_reversed_prompt():
    t = data.make_token_task("reverse", n=16, n_digits=4, vocab_size=8, seed=0)
    prompt = t.inputs[:, :4]
    assert torch.all(t.inputs[:, 4] == t.sep)
    answer = t.targets[:, 4:]
    assert torch.equal(answer, prompt.flip(1))
    assert torch.all(t.targets[:, :4] == data.IGNORE_INDEX)


def test_modsum_task_is_running_sum():
    t = data.make_token_task("modsum", n=8, n_digits=3, vocab_size=6, seed=2)
    expect = t.inputs[:, :3].cumsum(1) % 5
    assert torch.equal(t.targets[:, 3:], expect)


def test_answer_accuracy_perfect_logits():
    t = data.make_token_task("copy", n=32, n_digits=3, vocab_size=7, seed=0)
    logits = torch.nn.functional.one_hot(t.targets.clamp(min=0), t.vocab_size).float()
    assert t.answer_accuracy(logits) == 1.0
    with pytest.raises(ValueError):
        t.answer_accuracy(logits[:, :2])


def test_batches_are_a_pure_function_of_step():
    x, y = data.make_regression(100, 3, seed=0)
    b = data.Batches(x, y, batch_size=8, seed=5)
    first = [b(s) for s in range(5)]
    again = data.Batches(x, y, batch_size=8, seed=5)
    assert torch.equal(again(3)[0], first[3][0])  # no hidden state: step 3 without steps 0-2
    assert not torch.equal(first[0][0], first[1][0])
    assert torch.equal(x[b.indices(2)], first[2][0])


def test_batches_ranks_partition_the_global_batch():
    x = torch.arange(50).float().unsqueeze(1)
    b = data.Batches(x, batch_size=6, seed=0)
    (full,) = b(7)
    parts = [b(7, rank=r, world_size=3)[0] for r in range(3)]
    assert torch.equal(torch.cat(parts), full)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="unknown token task"):
        data.make_token_task("sort")
    with pytest.raises(ValueError):
        data.make_regression(0)
    with pytest.raises(TypeError):
        data.make_classification(10.5)
    with pytest.raises(ValueError, match="disagree"):
        data.Batches(torch.zeros(3), torch.zeros(4), batch_size=2)
    b = data.Batches(torch.zeros(10), batch_size=4)
    with pytest.raises(ValueError, match="divisible"):
        b(0, rank=0, world_size=3)
    with pytest.raises(ValueError):
        b(0, rank=2, world_size=2)
    with pytest.raises(ValueError):
        b(-1)


# ---- the data path (notebook 14): pack_records and count_opens ----------------------------------------------

def test_pack_records_writes_the_records_back_to_back(tmp_path):
    records = [b"alpha", b"", b"\x00\xff" * 1000, b"z"]
    index = data.pack_records(records, tmp_path / "pack.bin")
    blob = (tmp_path / "pack.bin").read_bytes()          # read back with plain Python, not labkit
    assert blob == b"".join(records)
    assert [blob[o:o + n] for o, n in index] == records
    assert index == [(0, 5), (5, 0), (5, 2000), (2005, 1)]


def test_pack_records_checks_its_arguments_and_overwrites_nothing(tmp_path):
    (tmp_path / "keep.bin").write_bytes(b"the user's file")
    with pytest.raises(ValueError, match="new file"):
        data.pack_records([b"x"], tmp_path / "keep.bin")
    assert (tmp_path / "keep.bin").read_bytes() == b"the user's file"
    with pytest.raises(ValueError, match="existing folder"):
        data.pack_records([b"x"], tmp_path / "missing" / "p.bin")
    with pytest.raises(TypeError, match="pathlib.Path"):
        data.pack_records([b"x"], str(tmp_path / "p.bin"))
    for bad in (b"abc", "abc", [b"x", "y"], [bytearray(b"x")], None):
        with pytest.raises(TypeError):
            data.pack_records(bad, tmp_path / "p.bin")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.bin"]


def test_count_opens_counts_every_way_of_opening_a_file(tmp_path):
    import os

    path = tmp_path / "f.bin"
    path.write_bytes(b"abc")
    with data.count_opens() as n:
        path.read_bytes()
        with open(path, "rb") as f:
            f.read()
        path.open("rb").close()
        os.close(os.open(path, os.O_RDONLY))
    assert n.count == 4
    path.read_bytes()
    assert n.count == 4, "nothing is counted after the block"


def test_count_opens_nests_and_sees_no_reads_of_an_open_file(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(100)))
    with data.count_opens() as outer, open(path, "rb") as f:
        with data.count_opens() as inner:
            for i in range(10):
                f.seek(i * 10)
                f.read(10)
        path.read_bytes()
    assert (outer.count, inner.count) == (2, 0)
