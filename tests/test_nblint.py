"""tools/nblint.py: the heuristics on synthetic cells. Measured sentences next to a measuring cell are flagged,
formulas, definitions and datasheet facts are not; asserts that cannot fail (or may never run) are flagged, asserts
that can fail are not; and every notebook source passes (``python tools/nblint.py`` says where it does not)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

BATCH_TABLE = """\
# %%
# NBVAL_IGNORE_OUTPUT
points = I.batch_sweep(model, test.inputs, [1, 4, 16, 64, 256], repeats=30)
for p in points:
    print(f"{p.batch:>6} {p.latency.p50 * 1e3:8.2f} {p.latency.p99 * 1e3:8.2f} {p.throughput:11,.0f}")
"""

TTFT_CELL = """\
# %%
# NBVAL_IGNORE_OUTPUT
gen = I.timed_generate(model, prompt, 6)
print(f"TTFT {gen.ttft * 1e3:.2f} ms, then {gen.time_per_output_token * 1e3:.2f} ms per output token")
"""

UNMARKED_TIMING_CELL = """\
# %%
t0 = time.perf_counter()
first = model(prompt)
ttft = time.perf_counter() - t0
"""

EXACT_CELL = """\
# %%
print(2 * (4 - 1) / 4)
"""


def markdown(text: str) -> str:
    body = "\n".join(f"# {line}".rstrip() for line in textwrap.dedent(text).strip().splitlines())
    return f"# %% [markdown]\n{body}\n"


def code(text: str, *, ignore: bool = False) -> str:
    head = "# %%\n" + ("# NBVAL_IGNORE_OUTPUT\n" if ignore else "")
    return head + textwrap.dedent(text).strip() + "\n"


@pytest.fixture(scope="module")
def nblint(load_tool):
    return load_tool("nblint")


def cells_of(nblint, *parts: str, notebook: str = "99"):
    return nblint.parse_cells("\n".join(parts), notebook=notebook, path=f"tools/nbsrc/{notebook}_test.py")


def flagged(nblint, *parts: str, exempt=None, notebook: str = "99") -> list[str]:
    """The sentences flagged in the cells ``parts`` (with no exemption list unless one is given)."""
    cells = cells_of(nblint, *parts, notebook=notebook)
    return [f.text for f in nblint.measured_sentences(cells, exempt={} if exempt is None else exempt)]


def assert_kinds(nblint, source: str) -> list[str]:
    return [f.kind for f in nblint.vacuous_asserts(cells_of(nblint, code(source)))]


# ------------------------------------------------------------------------------------------------ cells
def test_read_cells_splits_kinds_tags_and_lines(nblint, tmp_path):
    src = tmp_path / "14_demo.py"
    src.write_text("# %% [markdown]\n# # Title\n#\n# Some *text*.\n\n# %%\nx = 1\n\n"
                   "# %%\n# NBVAL_IGNORE_OUTPUT\nprint(x)\n\n# %% tags=[\"workspace-clear\"]\ny = 2\n")
    cells = nblint.read_cells(src)
    assert [c.kind for c in cells] == ["markdown", "code", "code", "code"]
    assert cells[0].lines == ("# Title", "", "Some *text*.")
    assert [c.line for c in cells] == [2, 7, 10, 14]
    assert cells[2].ignores_output and not cells[1].ignores_output
    assert cells[3].tags == {"workspace-clear"}
    assert {c.notebook for c in cells} == {"14"}


def test_sentence_lines_point_into_the_file(nblint):
    cells = cells_of(nblint, BATCH_TABLE, markdown("""
        First sentence, no claim.
        Throughput grows with the batch; so does every
        request's latency.
    """))
    (finding,) = nblint.measured_sentences(cells, exempt={})
    assert finding.line == 9 and finding.kind == "measured-sentence"
    assert str(finding).startswith("tools/nbsrc/99_test.py:9: measured-sentence: Throughput grows with the")


# ------------------------------------------------------------------------------- (A) the two regressions
def test_batch_table_comment_is_flagged(nblint):
    sentence = "Throughput grows with the batch; so does every request's latency."
    assert flagged(nblint, BATCH_TABLE, markdown(sentence)) == [sentence]


def test_ttft_promise_before_the_timing_cell_is_flagged(nblint):
    sentence = "Each later token costs about as much as the first."
    assert flagged(nblint, markdown(f"The tiny GPT has no KV cache. {sentence}"), TTFT_CELL) == [sentence]
    assert flagged(nblint, TTFT_CELL, markdown(sentence)) == [sentence]


def test_a_cell_that_times_counts_without_the_nbval_marker(nblint):
    sentence = "Each later token costs about as much as the first."
    assert flagged(nblint, UNMARKED_TIMING_CELL, markdown(sentence)) == [sentence]


def test_the_same_sentence_next_to_an_exact_cell_is_not_flagged(nblint):
    sentence = "Throughput grows with the batch; so does every request's latency."
    assert flagged(nblint, EXACT_CELL, markdown(sentence)) == []


@pytest.mark.parametrize("sentence", [
    "INT8 ran 2.5x faster than fp32.",
    "The copy reached 12.5 GB/s.",
    "The step took 41 ms at batch 64.",
    "P99 latency is higher than P50 by a wide margin.",
    "The low-precision steps are usually slower than fp32 here.",   # hedged, but about this run
    "A 3× speed-up over eager.",
])
def test_measured_sentences_are_flagged(nblint, sentence):
    assert flagged(nblint, BATCH_TABLE, markdown(sentence)) == [sentence]


# ------------------------------------------------------------------------------ (A) what is not flagged
@pytest.mark.parametrize("text", [
    "busbw = algbw × 2(n−1)/n, so that busbw can be compared with the link's bandwidth.",
    "$\\text{bubble} = (p-1)/(m+p-1)$",
    "The bubble, $(p-1)/(m+p-1)$ of the step, shrinks as $m$ grows.",
    "an H100 has 989 TFLOP/s of dense BF16 (datasheet).",
    "The theoretical peak is 2 FLOPs per FMA × 16 lanes × 2 units per cycle.",
    "Which finishes first: one big add, or 2000 tiny adds, or are they about as fast as each other?",
    "Rank 1 sleeps 20 ms per micro-batch, 80 ms per step.",
    "Upgrading cuBLAS alone can speed up matmuls.",
    "On a GPU the odd size falls back to a slower kernel.",
    "A dimension that does not divide falls back to a slower path.",
    "The tensor is 2048 × 2048, run with `--slow-ms 20`.",
    "Now time the forward pass at batch sizes 1 to 256:",
])
def test_formulas_definitions_and_quoted_facts_are_not_flagged(nblint, text):
    assert flagged(nblint, BATCH_TABLE, markdown(text)) == []


def test_only_the_paragraph_next_to_the_cell_is_read(nblint):
    later = "Batching raises throughput and latency grows with it."
    after = markdown(f"""
        The table prints each batch's P50 and P99.

        {later}
    """)
    assert flagged(nblint, BATCH_TABLE, after) == []
    assert flagged(nblint, markdown(f"{later}\n\nNow the timings:"), BATCH_TABLE) == []
    assert flagged(nblint, BATCH_TABLE, markdown(f"## 6. Next section\n\n{later}")) == []


def test_exempt_entries_silence_a_sentence_and_go_stale(nblint):
    sentence = "A hundred ranks writing at once slow everybody down."
    parts = (BATCH_TABLE, markdown(sentence))
    assert flagged(nblint, *parts) == [sentence]
    exempt = {("99", "A hundred ranks writing"): "a property of shared file systems, not measured here"}
    assert flagged(nblint, *parts, exempt=exempt) == []
    assert nblint.stale_exemptions(cells_of(nblint, *parts), exempt) == []
    assert flagged(nblint, *parts, exempt=exempt, notebook="98") == [sentence]   # another notebook's entry
    stale = nblint.stale_exemptions(cells_of(nblint, EXACT_CELL, markdown(sentence)), exempt)
    assert [f.kind for f in stale] == ["stale-exempt"]
    no_reason = nblint.stale_exemptions(cells_of(nblint, *parts), {("99", "A hundred ranks"): " "})
    assert [f.why for f in no_reason] == ["gives no reason"]


def test_the_module_exempt_entries_give_reasons(nblint):
    for (number, prefix), why in nblint.EXEMPT.items():
        assert number.isdigit() and prefix.strip() and len(why.split()) >= 3, (number, prefix, why)


# ---------------------------------------------------------------------------------- (B) vacuous asserts
@pytest.mark.parametrize("source, kind", [
    ("assert True", "assert-literal"),
    ("assert 1 < 2", "assert-literal"),
    ("assert sum({'a': 1, 'b': 2}.values()) > 1", "assert-literal"),
    ("assert all(v > 0 for v in (1, 2, 3))", "assert-literal"),
    ("assert (x > 0, 'x must be positive')", "assert-literal"),
    ("assert x > 0 or True", "assert-literal"),
    ("assert x == x", "assert-self"),
    ("assert f(a) <= f(a)", "assert-self"),
    ("y = a + b\nassert y == a + b", "assert-just-assigned"),
    ("ratio = t1 / t2\nassert t1 / t2 == ratio", "assert-just-assigned"),
    ("assert lat.p99 >= lat.p50", "assert-order-statistic"),
    ("assert all(p.latency.p99 >= p.latency.p50 for p in points)", "assert-order-statistic"),
    ("assert max(xs) >= min(xs)", "assert-order-statistic"),
    ("assert stats.median <= stats.max", "assert-order-statistic"),
    ("if 2 < ridge < 150:\n    assert bounds['mm'] == 'compute'", "assert-conditional"),
    ("if speedup > 1.2:\n    print('fast')\nelse:\n    assert speedup > 0", "assert-conditional"),
    ("for n in ns:\n    if n >= 4:\n        assert t[n] < t[1]", "assert-conditional"),
])
def test_vacuous_asserts_are_flagged(nblint, source, kind):
    assert assert_kinds(nblint, source) == [kind]


@pytest.mark.parametrize("source", [
    "assert measured < 0.1",
    "a = model(x).sum()\nb = reference(x).sum()\nassert a == b",
    "y = a + b\nassert y == b + a + 0",
    "assert err['fp64'] < 1e-6 and err['fp32'] > 0.1",
    "assert by[256].latency.p50 > by[1].latency.p50",
    "assert lat.p99 > lat.p50",                    # strict: fails when every sample is equal
    "assert slow.p50 >= fast.p99",                 # two samples
    "assert len({b.checksum for b in builds.values()}) == 1",
    "if builds is not None:\n    assert builds['-O2'].seconds < builds['-O0'].seconds",
    "if device.cpu_class() == 'amx':\n    assert mm.speedup('bf16') > 1.2",
    "def check(n):\n    if n > 0:\n        assert table[n] >= 0\n    return n",
    "assert math.isfinite(x)",
])
def test_asserts_that_can_fail_are_not_flagged(nblint, source):
    assert assert_kinds(nblint, source) == []


def test_vacuous_assert_lines_and_text(nblint):
    cells = cells_of(nblint, markdown("Intro."), code("x = 1\nassert x == x"))
    (finding,) = nblint.vacuous_asserts(cells)
    assert (finding.line, finding.kind, finding.text) == (6, "assert-self", "assert x == x")


def test_an_unparsable_cell_is_reported_not_raised(nblint):
    assert assert_kinds(nblint, "def broken(:\n    pass") == ["syntax-error"]


# --------------------------------------------------------------------------------------------------- CLI
def test_main_prints_findings_and_exits_1(nblint, tmp_path, capsys):
    bad = tmp_path / "99_bad.py"
    bad.write_text(BATCH_TABLE + "\n" + markdown("Throughput grows with the batch.") + "\n# %%\nassert True\n")
    good = tmp_path / "98_good.py"
    good.write_text(EXACT_CELL + "\n" + markdown("Exact: 2(n-1)/n = 1.5 for n = 4."))
    assert nblint.main([str(good)]) == 0
    assert nblint.main([str(bad)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [f"{bad}:8: measured-sentence: Throughput grows with the batch. "
                   "(trend; after the cell at line 2 (NBVAL_IGNORE_OUTPUT))",
                   f"{bad}:11: assert-literal: assert True (reads no variable: its value is fixed)"]


def test_cells_agree_with_jupytext(nblint):
    jupytext = pytest.importorskip("jupytext")
    text = ("# %% [markdown]\n# # Title\n#\n# Text with `code`.\n\n# %%\n# %matplotlib inline\nimport math\n\n"
            "# %% tags=[\"workspace-clear\"]\n# NBVAL_IGNORE_OUTPUT\nprint(math.pi)\n\n"
            "# %% [markdown]\n# > a quote\n# - an item\n")
    ours = nblint.parse_cells(text)
    theirs = jupytext.reads(text, fmt="py:percent").cells
    assert [c.kind for c in ours] == [c.cell_type for c in theirs]
    assert [c.source for c in ours if c.kind == "markdown"] == [
        c.source for c in theirs if c.cell_type == "markdown"]
    assert [set(c.tags) - {"NBVAL_IGNORE_OUTPUT"} for c in ours] == [
        set(c.metadata.get("tags", [])) for c in theirs]


def test_every_notebook_source_passes_the_lint(nblint):
    """The two rules hold in every notebook: no measured sentence in fixed markdown, no assert that cannot fail."""
    root = Path(__file__).resolve().parents[1]
    findings = [str(f) for path in sorted((root / "tools" / "nbsrc").glob("[0-9][0-9]_*.py")) for f in nblint.lint(path)]
    assert findings == []


def test_a_translated_cell_is_left_to_its_english_partner(nblint):
    """A Chinese partner (lang="zh") says what its English cell says: only the English is linted, and the partner
    sitting between it and the timing cell does not hide the English sentence from the check."""
    sentence = "Each later token costs about as much as the first."
    zh = '# %% [markdown] lang="zh" en="0123456789ab"\n# 之后每个 token 的代价与第一个差不多。\n'
    assert flagged(nblint, markdown(sentence), zh, TTFT_CELL) == [sentence]
    assert [c.kind for c in cells_of(nblint, markdown(sentence), zh, TTFT_CELL)] == ["markdown", "code"]
