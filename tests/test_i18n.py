"""labkit speaks the notebook's language: the message catalogs are complete and compiled, the language follows the
edition, and what check(), progress and the doctor print comes out in Chinese in the Chinese edition.

The catalog check is tools/i18n.py's: every learner-facing message (the strings labkit passes to gettext, and every
exercise's prompt, hint, method, worked solution, typical-mistake answer and success line) has a Chinese translation
with the same {fields}, and labkit.mo is labkit.po compiled. Unit tests below show it catches each drift.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import i18n as T  # noqa: E402  tools/i18n.py

from labkit import check as C  # noqa: E402
from labkit import env, i18n, workspace  # noqa: E402
from labkit import printed as P  # noqa: E402
from labkit.exercises import all_exercises, get_exercise  # noqa: E402

HAN = re.compile(r"[\u4e00-\u9fff]")


@pytest.fixture
def lang():
    """Set labkit's language for one test; back to automatic after it."""
    yield i18n.set_language
    i18n.set_language(None)


def _printed(fn, *args) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        fn(*args)
    return buf.getvalue()


# --- the catalog ---------------------------------------------------------------------------------------------

def test_every_learner_facing_message_has_a_chinese_translation():
    found = T.problems("zh")
    assert not found, "python tools/i18n.py check lists these; translate with `todo`/`merge`:\n" + "\n".join(found[:30])


def test_the_catalog_holds_every_exercise_text():
    template = T.extract()
    exs = all_exercises()
    for ex in (exs.values() if isinstance(exs, dict) else exs):
        for name in T.EXERCISE_FIELDS:
            text = getattr(ex, name)
            if text.strip():
                assert text in template, f"{ex.id} {name} is not extracted"
    assert "{id}: correct." in template and "Hint" in template, "check()'s own messages are extracted"


@pytest.fixture
def scratch_catalog(tmp_path, monkeypatch):
    """A copy of the locale folder that a test may break."""
    shutil.copytree(i18n.LOCALE_DIR, tmp_path / "locale")
    monkeypatch.setattr(i18n, "LOCALE_DIR", tmp_path / "locale")
    i18n._catalog.cache_clear()
    yield tmp_path / "locale"
    i18n._catalog.cache_clear()


def _edit_po(path: Path, msgid: str, new: str | None) -> None:
    from babel.messages.pofile import read_po

    with path.open("rb") as f:
        cat = read_po(f, locale="zh")
    if new is None:
        del cat[msgid]
    else:
        cat[msgid].string = new
    path.write_bytes(T._po_bytes(cat))


def test_the_check_catches_a_missing_a_wrong_field_and_a_stale_compile(scratch_catalog):
    po = T.po_path("zh")
    assert po.is_relative_to(scratch_catalog) and T.problems("zh") == []
    hint = get_exercise("01.fp16-max").hint
    _edit_po(po, hint, None)  # a translation deleted
    T.compile_catalogs()
    assert any(p.startswith("untranslated (exercise 01.fp16-max)") for p in T.problems("zh"))
    shutil.copytree(ROOT / "labkit" / "locale", scratch_catalog, dirs_exist_ok=True)
    _edit_po(po, "{id}: correct.", "{ID}：正确。")  # a field renamed in the translation
    T.compile_catalogs()
    assert any(p.startswith("fields differ") for p in T.problems("zh"))
    shutil.copytree(ROOT / "labkit" / "locale", scratch_catalog, dirs_exist_ok=True)
    _edit_po(po, "{id}: correct.", "{id}：完全正确。")  # the .po changed, the .mo not compiled again
    assert any("is not labkit.po compiled" in p for p in T.problems("zh"))


def test_an_untranslated_message_falls_back_to_english(scratch_catalog, lang):
    hint = get_exercise("01.fp16-max").hint
    lang("zh")
    assert HAN.search(i18n.gettext(hint))
    _edit_po(T.po_path("zh"), hint, None)
    T.compile_catalogs()
    i18n._catalog.cache_clear()
    assert i18n.gettext(hint) == hint, "one message falls back; the others stay Chinese"
    assert HAN.search(i18n.gettext("{id}: correct."))
    assert i18n.gettext("") == "" and i18n.gettext("no such message") == "no such message"


# --- which language --------------------------------------------------------------------------------------------

def test_the_language_follows_the_edition_folder_the_environment_and_the_kernel(tmp_path, monkeypatch, lang):
    monkeypatch.delenv(i18n.LANG_ENV, raising=False)
    zh = tmp_path / "notebooks" / "zh"
    zh.mkdir(parents=True)
    monkeypatch.chdir(zh)
    assert i18n.language() == "zh", "a kernel started in notebooks/zh speaks Chinese"
    monkeypatch.chdir(zh.parent)
    assert i18n.language() == "en"
    (tmp_path / "zh").mkdir()
    monkeypatch.chdir(tmp_path / "zh")
    assert i18n.language() == "en", "a folder named zh elsewhere is no edition"
    monkeypatch.setenv(i18n.LANG_ENV, "zh_CN.UTF-8")
    assert i18n.language() == "zh"
    monkeypatch.setenv(i18n.LANG_ENV, "fr_FR.UTF-8")
    assert i18n.language() == "en", "a language with no edition falls back to English"
    lang("zh")
    assert i18n.language() == "zh"
    lang("en")
    monkeypatch.setenv(i18n.LANG_ENV, "zh")
    assert i18n.language() == "en", "set_language wins over the environment"


@pytest.mark.parametrize("name,want", [("zh", "zh"), ("zh_CN.UTF-8", "zh"), ("zh-Hans", "zh"), ("ZH_TW", "zh"),
                                       ("en_US.UTF-8", "en"), ("C", "en"), ("POSIX", "en"), ("de", None),
                                       ("", None)])
def test_normalise(name, want):
    assert i18n.normalise(name) == want


def test_bad_input_is_refused(lang):
    with pytest.raises(ValueError, match="no edition"):
        lang("fr")
    with pytest.raises(TypeError):
        i18n.normalise(3)
    with pytest.raises(TypeError):
        i18n.gettext(None)
    with pytest.raises(ValueError, match="no edition"):
        i18n.translate("Hint", "klingon")
    with pytest.raises(TypeError):
        i18n.edition_of(3)


# --- what the learner sees ---------------------------------------------------------------------------------------

def test_check_answers_in_chinese_and_escalates(monkeypatch, lang):
    monkeypatch.setenv(C.PROGRESS_ENV, "off")
    ex = get_exercise("01.fp16-max")
    C.reset_results()
    english = [_printed(C.check, ex.id, a) for a in (1.0, 1.0, 1.0, 65504.0)]
    C.reset_results()
    lang("zh")
    chinese = [_printed(C.check, ex.id, a) for a in (1.0, 1.0, 1.0, 65504.0)]
    C.reset_results()
    assert english[0].startswith(f"✗ {ex.id}: not quite. Hint: {ex.hint}")
    for en_line, zh_line in zip(english, chinese):
        assert zh_line != en_line and HAN.search(zh_line), zh_line
        assert zh_line[0] == en_line[0], "the same mark (✗ or ✓)"
    assert i18n.translate(ex.hint, "zh") in chinese[0] and ex.hint not in chinese[0]
    assert i18n.translate(ex.method, "zh") in chinese[1]
    assert "(2 - 2**-10) * 2**15" in chinese[2], "the worked solution's code is the same code"
    assert chinese[3].startswith(f"✓ {ex.id}")


def test_solution_predict_and_progress_speak_chinese(tmp_path, monkeypatch, lang):
    monkeypatch.setenv(C.PROGRESS_ENV, str(tmp_path / "p.json"))
    lang("zh")
    C.reset_results()
    shown = _printed(C.solution, "01.fp16-max")
    assert HAN.search(shown) and "(2 - 2**-10) * 2**15" in shown
    predict = next(e for e in (all_exercises().values() if isinstance(all_exercises(), dict) else all_exercises())
                   if e.kind == "predict")
    assert HAN.search(_printed(C.predict, predict.id, ...))
    view = _printed(C.progress)
    assert HAN.search(view) and "01.fp16-max" not in view.split("\n", 1)[0]
    C.reset_results()


def test_the_doctor_report_is_aligned_in_chinese(lang):
    import unicodedata

    def cols(text: str) -> int:
        return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)

    english = env.format_report().splitlines()
    lang("zh")
    chinese = env.format_report().splitlines()
    assert len(chinese) == len(english) and chinese[:2] == english[:2]
    rows = 0
    for en_line, zh_line in zip(english[2:], chinese[2:]):
        label = en_line[:14].rstrip()
        if en_line.startswith("  ") or len(en_line) <= 14 or en_line[13] != " ":
            continue  # an environment variable, or a label alone on its line
        shown = i18n.translate(label, "zh")
        assert zh_line.startswith(shown), (label, zh_line)
        pad = len(zh_line[len(shown):]) - len(zh_line[len(shown):].lstrip(" "))
        assert cols(shown) + pad == 14, f"the value of {label!r} does not start in column 14: {zh_line!r}"
        rows += 1
    assert rows >= 8 and sum(bool(HAN.search(x)) for x in chinese) >= 5


# --- the Chinese workspace and JupyterLab's Chinese UI ---------------------------------------------------------

def test_a_chinese_workspace_copies_the_chinese_edition_and_speaks_chinese(tmp_path, monkeypatch):
    monkeypatch.delenv(i18n.LANG_ENV, raising=False)
    rep = workspace.update_workspace(ROOT, tmp_path / "work-zh", lang="zh")
    assert rep.created
    marker = json.loads((tmp_path / "work-zh" / workspace.MARKER).read_text())
    assert marker["lang"] == "zh"
    copy = json.loads((tmp_path / "work-zh" / "03_loss_scaling.ipynb").read_text())
    note = "".join(copy["cells"][0]["source"])
    assert HAN.search(note) and "../" in note and "notebooks/zh/03_loss_scaling.ipynb" in note
    first = "".join(next(c for c in copy["cells"][1:] if c["cell_type"] == "markdown")["source"])
    assert HAN.search(first), "the notebooks are the Chinese edition's"
    assert i18n.edition_of(tmp_path / "work-zh") == "zh" and i18n.edition_of(tmp_path) == "en"
    with pytest.raises(ValueError, match="edition"):
        workspace.update_workspace(ROOT, tmp_path / "work-zh", lang="en")
    with pytest.raises(ValueError, match="lang must be"):
        workspace.update_workspace(ROOT, tmp_path / "w3", lang="fr")
    english = workspace.update_workspace(ROOT, tmp_path / "work")
    assert english.created and json.loads((tmp_path / "work" / workspace.MARKER).read_text())["lang"] == "en"


def test_i18n_reads_the_workspace_marker_workspace_writes():
    assert i18n._WORKSPACE_MARKER == workspace.MARKER


def test_lab_settings_choose_the_chinese_ui_and_keep_other_settings(tmp_path):
    target = workspace.lab_settings("zh", tmp_path / "s")
    assert json.loads(target.read_text()) == {"locale": "zh_CN"}
    target.write_text(json.dumps({"locale": "en", "other": 1}))
    workspace.lab_settings("zh", tmp_path / "s")
    assert json.loads(target.read_text()) == {"locale": "zh_CN", "other": 1}
    target.write_text("not json")
    with pytest.raises(ValueError, match="not a JupyterLab settings file"):
        workspace.lab_settings("zh", tmp_path / "s")
    assert target.read_text() == "not json", "a file it cannot read is left as it was"
    with pytest.raises(ValueError):
        workspace.lab_settings("fr", tmp_path / "s")


def test_the_zh_cn_language_pack_is_installed():
    import importlib.util

    spec = importlib.util.find_spec("jupyterlab_language_pack_zh_CN")
    assert spec is not None, "pip install jupyterlab-language-pack-zh-CN (a labkit dependency)"
    locale = Path(spec.origin).parent / "locale" / "zh_CN" / "LC_MESSAGES"
    assert any(locale.glob("jupyterlab*.json")), locale


def test_make_lab_picks_the_edition_from_the_locale():
    import subprocess

    def dry(**env_vars: str) -> str:
        env = {"PATH": "/usr/bin:/bin", **env_vars}
        out = subprocess.run(["make", "-n", "lab", "-o", ".venv/.base", "VENV=.venv"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    zh = dry(LANG="zh_CN.UTF-8")
    assert "--dir work-zh --lang zh" in zh and "JUPYTERLAB_SETTINGS_DIR=" in zh and "lab-settings --lang zh" in zh
    en = dry(LANG="en_US.UTF-8")
    assert "--dir work --lang en" in en and "JUPYTERLAB_SETTINGS_DIR=" not in en
    assert "--dir work-zh --lang zh" in dry(LANG="C", LAB_LANG="zh")
    assert "--dir work --lang en" in dry(LC_ALL="en_US.UTF-8", LANG="zh_CN.UTF-8"), "LC_ALL wins"


# --- the notebooks' printed lines (labkit.printed) ------------------------------------------------------------------

def test_template_parts_reads_fields_nested_braces_and_literal_braces():
    assert P.template_parts("loss {a.item():.3f} {{x}} {len({1, 2})}!") == \
        ["loss ", ("a.item():.3f",), " {x} ", ("len({1, 2})",), "!"]
    assert P.template_parts("{x:>{w}}") == [("x:>{w}",)]
    for bad in ("a } b", "a {b", "{len({1)}"):
        with pytest.raises(ValueError):
            P.template_parts(bad)


def test_templates_of_writes_each_printed_line_as_a_template():
    t = P.templates_of
    assert t('print(f"loss {loss.item():.3f} after {n} steps", "| fits:", ok)') == \
        ("loss {loss.item():.3f} after {n} steps | fits: {ok}",)
    # a choice between two literal sentences is two templates; a "\n" splits lines; a line with no word is no sentence
    assert t('print(f"{total} KB: {\'fits\' if ok else \'does not fit\'} in SRAM")') == \
        ("{total} KB: fits in SRAM", "{total} KB: does not fit in SRAM")
    assert t('print("first line:", a, "\\nsecond line:", b)') == ("first line: {a} ", "second line: {b}")
    assert t('print(a, "->", b)') == t('print("x y z", file=f)') == t('print(*rows)') == ()
    assert t('print("a {brace}", x, sep=", ")') == ("a {{brace}}, {x}",)
    # a choice of literal texts under a format spec is padded as the code pads it; a set display keeps its braces
    assert t('print(f"{n:2d} {\'2 ranks\' if two else \'1 process\':<10} {title}")') == \
        ("{n:2d} 2 ranks    {title}", "{n:2d} 1 process  {title}")
    assert t('print("seen:", {k for k in ks})') == ("seen: { {k for k in ks} }",)
    # a name the cell sets once to a choice of texts prints one of them; `x or "text"` prints the value or the text
    assert t('v = "faster" if a else "slower"\nprint(f"step time: {v} than fp32")') == \
        ("step time: faster than fp32", "step time: slower than fp32")
    assert t('print(f"runtime: {found() or \'none detected\'}")') == ("runtime: {found()}", "runtime: none detected")
    # the header before *rows with sep="\n"; magics, %%writefile and a syntax error
    assert t('print("rows:", *rows, sep="\\n")') == ("rows:",)
    assert t('%matplotlib inline\nprint("hello there", x)') == ("hello there {x}",)
    assert t('%%writefile r.py\nprint("rank ready:", r)') == ("rank ready: {r}",)
    assert t('%%bash\necho hello there') == t('print("unclosed') == ()


def test_every_printed_line_of_the_notebooks_is_in_the_catalog():
    lines = T.printed_lines()
    assert len(lines) > 300, "the extractor found too few printed lines: it stopped seeing print() calls"
    cat = T._read("zh")
    missing = [t for t, *_ in lines if cat.get(t, context=P.CONTEXT) is None]
    assert not missing, f"printed lines not in the catalog (python tools/i18n.py update): {missing[:3]}"


def _printed_catalog() -> list:
    return [m for m in T._read("zh") if m.context == P.CONTEXT and m.id]


@pytest.mark.parametrize("values", [
    lambda k: f"⟦{k}⟧",                                      # values that appear nowhere else
    lambda k: ["float16", "cuda:0", "[1, 2, 3]", "a, b: c", "0.5 of 2", "True"][k % 6],  # realistic, with separators
], ids=["markers", "realistic"])
def test_each_printed_template_translates_its_own_lines(values):
    """A line made from each template comes out as that template's translation with the same values (the markers,
    also against every other template: none shadows it), and a line with realistic values (dtypes, devices, lists,
    values holding ", " or ": ") is still matched and translated by its template."""
    wrong = []
    for msg in _printed_catalog():
        src = P.template_parts(msg.id)
        names = list(dict.fromkeys(x[0] for x in src if isinstance(x, tuple)))
        shown = {n: values(k) for k, n in enumerate(names)}
        line = "".join(shown[p[0]] if isinstance(p, tuple) else p for p in src)
        got = P.translate_line(line, "zh", among=[msg.id])
        want = i18n.tidy("".join(shown[p[0]] if isinstance(p, tuple) else p for p in P.template_parts(msg.string)))
        realistic = values(0) == "float16"  # a value holding the next literal may split at it: still translated
        if (got == line and msg.string != msg.id) if realistic else (got != want):
            wrong.append((line, got, want))
        if values(0).startswith("⟦") and P.translate_line(line, "zh") != want:  # against every template: no shadow
            wrong.append((line, P.translate_line(line, "zh"), want))
    assert not wrong, f"{len(wrong)} printed lines not translated by their own template, e.g. {wrong[:2]}"


def test_a_printed_line_keeps_its_values_and_an_unknown_line_passes(lang):
    msg = next(m for m in _printed_catalog() if m.id == "This machine: {device.cpu_summary()}")
    got = P.translate_line("This machine: AMD EPYC, 2 cores", "zh")
    assert got == i18n.tidy(msg.string.replace("{device.cpu_summary()}", "AMD EPYC, 2 cores")) and HAN.search(got)
    assert P.translate_line("This machine: AMD EPYC, 2 cores", "en") == "This machine: AMD EPYC, 2 cores"
    assert P.translate_line("no template prints this", "zh") == "no template prints this"
    assert P.translate_line("This machine: x", "zh", among=["another template"]) == "This machine: x"
    long = "This machine: " + "x " * P.MAX_LINE  # data, not a sentence: passes untranslated (and at once)
    assert P.translate_line(long, "zh") == long
    lang("zh")
    assert P.translate_line("This machine: x") != "This machine: x"
    # a value that is itself a labkit message of two words or more (a case's title) is shown translated, padding kept
    from labkit import clinic
    case = clinic.CASES["clip"]
    line = f"{case.number:2d}  {case.key:<12} {'1 process':<10} {case.title}"
    got = P.translate_line(line)
    assert got.endswith(i18n.translate(case.title, "zh")) and HAN.search(got) and case.title not in got
    other = P.translate_line(line.replace(case.title, "Made-up title text"))
    assert other.endswith("Made-up title text") and HAN.search(other)


class _Stream(io.StringIO):
    encoding = "utf-8-test"


def test_printed_lines_translates_whole_lines_per_thread_and_flushes_every_partial_one(lang):
    import threading
    out = _Stream()
    s = P.PrintedLines(out, "zh")
    print("This machine:", "box", file=s, end="")     # a partial line waits for its newline
    assert out.getvalue() == ""
    t = threading.Thread(target=lambda: print("no template prints this", file=s) or print("thread's", file=s, end=""))
    t.start()
    t.join()
    assert out.getvalue() == "no template prints this\n"   # the thread's line did not pick up the partial one
    s.write("\n")
    assert out.getvalue().endswith(P.translate_line("This machine: box", "zh") + "\n")
    s.write("This machine: spinning\r")                    # a progress line ends with \\r: translated, \\r kept
    assert out.getvalue().endswith(P.translate_line("This machine: spinning", "zh") + "\r")
    s.write("tail")
    s.flush()                                               # every thread's partial line comes out
    assert out.getvalue().endswith("thread'stail") or out.getvalue().endswith("tailthread's")
    assert s.encoding == "utf-8-test"
    auto = P.PrintedLines(_Stream())                        # no language given: the language of the moment
    lang("en")
    print("This machine: box", file=auto)
    lang("zh")
    print("This machine: box", file=auto)
    assert auto.stream.getvalue().splitlines() == ["This machine: box", P.translate_line("This machine: box", "zh")]
    with pytest.raises(TypeError):
        s.write(b"bytes")
    with pytest.raises(TypeError):
        P.PrintedLines(object(), "zh")
    with pytest.raises(ValueError):
        P.PrintedLines(out, "fr")


class _Events:
    def __init__(self):
        self.hooks = []

    def register(self, name, fn):
        self.hooks.append((name, fn))


def test_load_ext_wraps_stdout_once_in_the_chinese_edition_and_learns_each_cell(tmp_path, monkeypatch):
    """``%load_ext labkit`` in a kernel started in notebooks/zh wraps stdout and tries each cell's templates; in
    notebooks/ it does nothing."""
    import labkit
    plain = io.StringIO()
    monkeypatch.setattr(sys, "stdout", plain)
    monkeypatch.delenv(i18n.LANG_ENV, raising=False)
    monkeypatch.chdir(ROOT / "notebooks")
    shell = type("Shell", (), {"events": _Events(), "user_ns": {"_ih": ["", 'print("This machine ran:", x)']}})()
    # nbval runs cells without history: the kernel's execute request names the cell running %load_ext
    kernel = type("Kernel", (), {"get_parent": lambda self: {"content": {"code": 'print("This machine ran:", x)'}}})
    shell.kernel = kernel()
    shell.user_ns = {"_ih": [""]}
    labkit.load_ipython_extension(shell)
    assert sys.stdout is plain and not shell.events.hooks
    monkeypatch.chdir(ROOT / "notebooks" / "zh")
    labkit.load_ipython_extension(shell)
    wrapped = sys.stdout
    assert isinstance(wrapped, P.PrintedLines) and wrapped.stream is plain
    assert wrapped.among == {"This machine ran: {x}"}        # the cell running %load_ext prints in Chinese too
    labkit.load_ipython_extension(shell)                     # %load_ext twice: one wrapper, one hook
    assert sys.stdout is wrapped and len(shell.events.hooks) == 1
    print("This machine: box")                              # no cell has printed that yet: it passes
    (name, hook), = shell.events.hooks
    hook(type("Info", (), {"raw_cell": 'print("This machine:", device.cpu_summary())'})())
    print("This machine: box")
    assert name == "pre_run_cell" and plain.getvalue().splitlines() == [
        "This machine: box", P.translate_line("This machine: box", "zh")]
    with pytest.raises(ValueError):
        P.load(shell, lang="xx")
    with pytest.raises(TypeError):
        P.load(object(), lang="zh")


def _stream_lines(path: Path) -> list[str]:
    nb = json.loads(path.read_text(encoding="utf-8"))
    return [ln for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])
            if o.get("output_type") == "stream" and o.get("name") == "stdout"
            for ln in "".join(o["text"]).splitlines()]


def test_the_chinese_notebooks_print_in_chinese():
    """The stored Chinese notebooks hold no line an English template makes that has a different translation, and
    print as many lines as the English; and the templates are the notebooks' own: most of them make a line the
    stored English notebooks print (the rest belong to branches this machine does not take: a GPU, another CPU
    class, a missing package)."""
    templates = [(P._Template(m.id, m.id), m.id) for m in _printed_catalog() if m.string and m.string != m.id]
    zh = {p.name: _stream_lines(p) for p in sorted((ROOT / "notebooks" / "zh").glob("[0-9][0-9]_*.ipynb"))}
    left = [(name, ln) for name, lines in zh.items() for ln in lines if any(t.match(ln) for t, _ in templates)]
    assert not left, f"{len(left)} English lines in the Chinese notebooks' outputs, e.g. {left[:3]}"
    english = {p.name: _stream_lines(p) for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))}
    assert set(zh) == set(english)
    for name in zh:  # the same runs, in the other language: the line counts differ only by run-to-run noise
        assert abs(len(zh[name]) - len(english[name])) <= max(3, len(english[name]) // 10), name
    every = [ln for lines in english.values() for ln in lines]
    seen = [t for t, _ in templates if any(t.match(ln) for ln in every)]
    assert len(seen) > 0.75 * len(templates), f"only {len(seen)} of {len(templates)} templates match a printed line"
