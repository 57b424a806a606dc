"""The graders of notebooks 09 and 10 name more than their one typical mistake: every exercise has further wrong
answers a learner of distributed training typically gives (off by the world size, the accumulation forgotten, the
per-GPU batch for the global one, the wrong tensor reduced, a refusal that checks only half the divisor...), each
graded wrong with a message that names that mistake; answers that are right another way stay right."""

from __future__ import annotations

import pytest
import torch
from torch.distributed import ReduceOp

from labkit import check as C
from labkit.check import evaluate
from labkit.exercises import all_exercises
from labkit.exercises.nb10 import _reference_config

EXERCISES = all_exercises()
IDS = sorted(i for i in EXERCISES if i.startswith(("09.", "10.")))


@pytest.fixture(autouse=True)
def _fresh_kernel(monkeypatch):
    """No hint levels, predictions or progress carried from one test to the next (or into the user's record)."""
    monkeypatch.setenv("LABKIT_PROGRESS", "off")
    C.reset_results()
    yield
    C.reset_results()


# --------------------------------------------------------------------------------------------------
# the learners' functions
# --------------------------------------------------------------------------------------------------

def busbw_times_two(algbw, n):
    return algbw * 2  # both halves of the ring, but the whole message in each


def busbw_no_over_n(algbw, n):
    return algbw * 2 * (n - 1)  # ring steps counted, not bytes


def busbw_inverted(algbw, n):
    return algbw * n / (2 * (n - 1))  # divides by the factor (and by zero at n = 1)


def busbw_factor_only(algbw, n):
    return 2 * (n - 1) / n


def average_into_a_copy(params, world_size, all_reduce):
    for p in params:
        g = p.grad / world_size  # a new tensor: p.grad never changes
        all_reduce(g)


def average_returned(params, world_size, all_reduce):
    out = []
    for p in params:
        g = p.grad.clone()
        all_reduce(g)
        out.append(g / world_size)
    return out


def average_the_weights(params, world_size, all_reduce):
    for p in params:
        all_reduce(p.data)  # the weights, not the gradients
        p.grad /= world_size


def average_by_len_params(params, world_size, all_reduce):
    for p in params:
        all_reduce(p.grad)
        p.grad /= len(params)


def average_first_only(params, world_size, all_reduce):
    for p in params:
        all_reduce(p.grad)
        p.grad /= world_size
        return


def average_with_torch_distributed(params, world_size, all_reduce):
    import torch.distributed as dist

    for p in params:
        dist.all_reduce(p.grad)
        p.grad /= world_size


def _triple(gb, mb, accum):
    return {"train_batch_size": gb, "train_micro_batch_size_per_gpu": mb, "gradient_accumulation_steps": accum}


def batch_keys_refuses_only_micro(global_batch, micro_batch, world_size):
    if global_batch % micro_batch:  # the ranks forgotten in the refusal
        raise ValueError(f"{global_batch} is not a multiple of {micro_batch}")
    return _triple(global_batch, micro_batch, global_batch // (micro_batch * world_size))


def batch_keys_precedence(global_batch, micro_batch, world_size):
    if global_batch % micro_batch * world_size:  # (global_batch % micro_batch) * world_size
        raise ValueError("cannot split")
    return _triple(global_batch, micro_batch, global_batch // (micro_batch * world_size))


def batch_keys_without_micro(global_batch, micro_batch, world_size):
    return _triple(global_batch, micro_batch, global_batch // world_size)


def batch_keys_asserts(global_batch, micro_batch, world_size):
    assert global_batch % (micro_batch * world_size) == 0
    return _triple(global_batch, micro_batch, global_batch // (micro_batch * world_size))


def batch_keys_rounds_up(global_batch, micro_batch, world_size):
    return _triple(global_batch, micro_batch, -(-global_batch // (micro_batch * world_size)))


def _config(**changes):
    """The reference config of 10.config with ``changes``: ``"fp16.hysteresis"`` sets a key inside a section,
    ``None`` removes the key."""
    cfg = _reference_config()
    for key, value in changes.items():
        section, _, name = key.rpartition(".")
        where = cfg[section] if section else cfg
        if value is None:
            del where[name]
        else:
            where[name] = value
    return cfg


# --------------------------------------------------------------------------------------------------
# the table: exercise -> [(typical wrong answer, what the message must say)]
# --------------------------------------------------------------------------------------------------

MORE_MISTAKES = {
    "09.global-batch": [
        (128, "a single node for a single micro-step"),  # 16 x 8, or 16 x 32 / 4
        (32, "the number of ranks, not of examples"),
        (8192, "counted twice"),
        (256, "one rank per GPU"),
    ],
    "09.lr-scaling": [
        (3e-4 * 512 / 256, "without the accumulation steps"),  # the global batch without accumulation
        (3e-4 * 256 / 2048, "upside down"),
        (3e-4 * 32, "scales by the number of GPUs"),
        (3e-4 * 16 / 256, "micro-batch of one GPU"),
        (3e-4 * 2048, "multiplies by the global batch itself"),
    ],
    "09.busbw": [
        (busbw_times_two, "leaves out the (n-1)/n"),
        (busbw_no_over_n, "counts the ring's steps, not bytes"),
        (busbw_inverted, "upside down"),
        (busbw_factor_only, "the factor alone"),
        (lambda algbw, n: algbw, "ignores the number of ranks"),
    ],
    "09.slow-rank": [
        (380, "one after another"),
        (220, "paid once per step"),
        (60, "how long the fast ranks idle"),
        (160, "still takes its time"),
    ],
    "09.allreduce-count": [
        ((36, 12), "the micro-batches inside no_sync()"),
        ((0, 12), "postpones the synchronisation"),
        ((1, 12), "for the whole run"),
        ((4, 12), "micro-batches in one optimizer step"),
        ((24, 12), "Count per rank"),
    ],
    "09.average-grads": [
        (average_into_a_copy, "no parameter's .grad changed"),
        (average_returned, "no parameter's .grad changed"),
        (average_the_weights, "never summed across the ranks"),
        (average_by_len_params, "the number of parameters"),
        (average_first_only, "others are left as they were"),
        (average_with_torch_distributed, "the all_reduce your function is given"),
    ],
    "10.config": [
        (_config(**{"fp16.initial_scale_power": 2**12}), "the exponent"),
        (_config(**{"fp16.hysteresis": 0}), "never halves"),
        (_config(**{"fp16.min_loss_scale": 2**12}), "min_loss_scale is the floor"),
        (_config(**{"zero_optimization.overlap_comm": None}, overlap_comm=True), "inside the 'zero_optimization'"),
        (_config(**{"fp16.hysteresis": None}, hysteresis=1), "inside the 'fp16'"),
        (_config(train_batch_size=8), "inconsistent batch config"),  # micro x accumulation, the GPUs forgotten
        (_config(**{"fp16.loss_scale": 2**12}), "dynamic loss scaling"),
    ],
    "10.stage2-grads": [
        (("less", "more"), "never leaves a rank with less"),
        ((2 * 68_000, "more"), "Predict one of"),  # a byte count, not an outcome
    ],
    "10.comm-volume": [  # 4 micro-batches per step; right: (2, 5, 12) Ψ
        ((8, 5, 12), "adds the micro-batches up locally"),           # stage 1 reducing every micro-batch
        ((1, 5, 12), "hand the updated weights back"),                # stage 1 without the all-gather
        ((2, 8, 12), "once, after the optimizer step"),                # stage 2 all-gathering per micro-batch
        ((2, 4, 12), "Count the all-gather of the updated weights"),   # stage 2 without the all-gather
        ((2, 5, 8), "twice per micro-batch"),                          # stage 3 gathering once per micro-batch
        ((2, 5, 3), "for every micro-batch, not once per step"),       # stage 3 per step
        ((2, 2, 3), "counts one micro-batch per step"),                # accumulation ignored
        ((2, 2, 12), "Stage 2 counts one micro-batch per step"),       # accumulation ignored at stage 2 only
        ((3, 9, 12), "You counted an all-reduce"),                     # DeepSpeed's bucket all-reduce, 2Ψ
        ((2, 5, 13), "no all-gather after the step"),                  # stage 3 gathering the updated weights
        ((2, 5, 16), "does not all-reduce them"),                      # stage 3 all-reducing its gradients
    ],
    "10.batch-triple": [
        (batch_keys_refuses_only_micro, "a multiple of the micro-batch"),
        (batch_keys_precedence, "a multiple of the micro-batch"),
        (batch_keys_without_micro, "forgets the micro-batch"),
        (batch_keys_asserts, "An assert is not a refusal"),
        (batch_keys_rounds_up, "rounding silently trains"),
    ],
}

CASES = [pytest.param(ex_id, answer, said, id=f"{ex_id}-{k}")
         for ex_id, rows in MORE_MISTAKES.items() for k, (answer, said) in enumerate(rows)]


def test_every_exercise_of_notebooks_09_and_10_has_more_mistakes():
    assert IDS, "no exercises of notebooks 09 and 10 registered"
    missing = [i for i in IDS if not MORE_MISTAKES.get(i)]
    assert not missing, f"add typical wrong answers to MORE_MISTAKES for {missing}"
    assert set(MORE_MISTAKES) <= set(IDS), set(MORE_MISTAKES) - set(IDS)


@pytest.mark.parametrize(("ex_id", "answer", "said"), CASES)
def test_more_typical_mistakes_are_named(ex_id, answer, said):
    ex = EXERCISES[ex_id]
    # the words must come from the grader, not from the hint every wrong answer is shown
    assert said not in ex.hint and said not in ex.method, f"{ex_id}: {said!r} is in the hint"
    out = evaluate(ex_id, answer)
    assert out.status == "wrong", out.message
    assert said in out.message, out.message
    assert "raised" not in out.message, out.message


ALSO_RIGHT = [
    ("09.global-batch", 2048.0),
    ("09.lr-scaling", 3e-4 * 8),
    ("09.busbw", lambda algbw, n: algbw * (2 * n - 2) / n),
]


def _divide_first(params, world_size, all_reduce):
    for p in params:
        p.grad /= world_size  # DDP's order: scale, then sum
        all_reduce(p.grad)


def _reduce_op_avg(params, world_size, all_reduce):
    for p in params:
        all_reduce(p.grad, op=ReduceOp.AVG)


def _rebinds(params, world_size, all_reduce):
    for p in params:
        all_reduce(p.grad)
        p.grad = p.grad / world_size


def _batch_keys_checks_micro_and_ranks(global_batch, micro_batch, world_size):
    if global_batch % micro_batch or (global_batch // micro_batch) % world_size:
        raise ValueError("cannot split")
    return _triple(global_batch, micro_batch, global_batch // micro_batch // world_size)


ALSO_RIGHT += [("09.average-grads", f) for f in (_divide_first, _reduce_op_avg, _rebinds)]
ALSO_RIGHT += [("10.batch-triple", _batch_keys_checks_micro_and_ranks), ("10.stage2-grads", (" More", "more")),
               ("10.config", _config(**{"fp16.loss_scale": None}))]  # loss_scale 0 is DeepSpeed's default


@pytest.mark.parametrize(("ex_id", "answer"), ALSO_RIGHT, ids=[f"{i}-{k}" for k, (i, _) in enumerate(ALSO_RIGHT)])
def test_answers_right_another_way_stay_right(ex_id, answer):
    out = evaluate(ex_id, answer)
    assert out.status == "correct", out.message


def test_a_stub_that_reduces_nothing_is_still_not_attempted():
    def average_gradients(params, world_size, all_reduce):
        pass

    assert evaluate("09.average-grads", average_gradients).status == "not attempted"


def test_the_simulated_all_reduce_takes_a_parameter_as_torch_distributed_does():
    from labkit.exercises.nb09 import simulate_all_reduce

    def reduce_weights(params, world_size, all_reduce):
        for p in params:
            p.data += p.grad
            all_reduce(p)  # a leaf that requires grad: torch.distributed writes it anyway

    grads = simulate_all_reduce(reduce_weights, [[torch.tensor([1.0])], [torch.tensor([3.0])]])
    assert [g[0].tolist() for g in grads] == [[1.0], [3.0]]
