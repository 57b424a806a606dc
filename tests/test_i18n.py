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


# --- the notebooks' printed lines ------------------------------------------------------------------------------------

def test_template_parts_reads_fields_nested_braces_and_literal_braces():
    assert i18n.template_parts("loss {a.item():.3f} {{x}} {len({1, 2})}!") == \
        ["loss ", ("a.item():.3f",), " {x} ", ("len({1, 2})",), "!"]
    assert i18n.template_parts("{x:>{w}}") == [("x:>{w}",)]
    for bad in ("a } b", "a {b", "{len({1)}"):
        with pytest.raises(ValueError):
            i18n.template_parts(bad)


def _calls(code: str) -> list[str]:
    import ast
    return [t for node in ast.walk(ast.parse(code)) if isinstance(node, ast.Call) for t in T._print_lines(node)]


def test_the_extractor_writes_each_printed_line_as_a_template():
    assert _calls('print(f"loss {loss.item():.3f} after {n} steps", "| fits:", ok)') == \
        ["loss {loss.item():.3f} after {n} steps | fits: {ok}"]
    # a choice between two literal sentences is two templates; a "\n" splits lines; a line with no word is no sentence
    assert _calls('print(f"{total} KB: {\'fits\' if ok else \'does not fit\'} in SRAM")') == \
        ["{total} KB: fits in SRAM", "{total} KB: does not fit in SRAM"]
    assert _calls('print("first line:", a, "\\nsecond line:", b)') == ["first line: {a} ", "second line: {b}"]
    assert _calls('print(a, "->", b)') == []
    assert _calls('print(*rows)') == _calls('print("x y z", file=f)') == []   # text unknown / not stdout
    assert _calls('print("a {brace}", x, sep=", ")') == ["a {{brace}}, {x}"]


def test_every_printed_line_of_the_notebooks_is_in_the_catalog():
    lines = T.printed_lines()
    assert len(lines) > 300, "the extractor found too few printed lines: it stopped seeing print() calls"
    cat = T._read("zh")
    missing = [t for t, *_ in lines if cat.get(t, context=i18n.PRINTED) is None]
    assert not missing, f"printed lines not in the catalog (python tools/i18n.py update): {missing[:3]}"


def test_each_printed_template_translates_its_own_lines():
    """A line made from each template (with values that appear nowhere else) comes out as that template's
    translation with the same values: no other template shadows it."""
    cat = T._read("zh")
    wrong = []
    for msg in cat:
        if msg.context != i18n.PRINTED or not msg.id:
            continue
        src = i18n.template_parts(msg.id)
        values = {p[0]: f"⟦{k}⟧" for k, p in enumerate(dict.fromkeys(x for x in src if isinstance(x, tuple)))}
        line = "".join(values[p[0]] if isinstance(p, tuple) else p for p in src)
        want = i18n.tidy("".join(values[p[0]] if isinstance(p, tuple) else p for p in i18n.template_parts(msg.string)))
        if "\n" not in line and i18n.translate_line(line, "zh") != want:
            wrong.append((line, i18n.translate_line(line, "zh"), want))
    assert not wrong, f"{len(wrong)} printed lines not translated by their own template, e.g. {wrong[:2]}"


def test_a_printed_line_keeps_its_values_and_an_unknown_line_passes(lang):
    cat = T._read("zh")
    msg = next(m for m in cat if m.context == i18n.PRINTED and m.id.startswith("This machine: {"))
    got = i18n.translate_line("This machine: AMD EPYC, 2 cores", "zh")
    assert got == i18n.tidy(msg.string.replace("{device.cpu_summary()}", "AMD EPYC, 2 cores")) and HAN.search(got)
    assert i18n.translate_line("This machine: AMD EPYC, 2 cores", "en") == "This machine: AMD EPYC, 2 cores"
    assert i18n.translate_line("no template prints this", "zh") == "no template prints this"
    lang("zh")
    assert i18n.translate_line("This machine: x") != "This machine: x"


def test_printed_lines_translates_whole_lines_per_thread_and_flushes_a_partial_one():
    import threading
    out = io.StringIO()
    s = i18n.PrintedLines(out, "zh")
    print("This machine:", "box", file=s, end="")     # a partial line waits for its newline
    assert out.getvalue() == ""
    t = threading.Thread(target=lambda: print("no template prints this", file=s))
    t.start()
    t.join()
    assert out.getvalue() == "no template prints this\n"   # the thread's line did not pick up the partial one
    s.write("\n")
    assert out.getvalue().endswith(i18n.translate_line("This machine: box", "zh") + "\n")
    s.write("tail")
    s.flush()
    assert out.getvalue().endswith("tail") and s.encoding == getattr(out, "encoding", None)
    with pytest.raises(TypeError):
        s.write(b"bytes")
    with pytest.raises(TypeError):
        i18n.PrintedLines(object(), "zh")
    with pytest.raises(ValueError):
        i18n.PrintedLines(out, "fr")


def test_translate_printed_wraps_stdout_once_and_only_in_another_edition(monkeypatch):
    plain = io.StringIO()
    monkeypatch.setattr(sys, "stdout", plain)
    assert i18n.translate_printed(lang="en") is plain and sys.stdout is plain
    wrapped = i18n.translate_printed(lang="zh")
    assert isinstance(wrapped, i18n.PrintedLines) and sys.stdout is wrapped and wrapped.stream is plain
    assert i18n.translate_printed(lang="zh") is wrapped          # %load_ext twice: one wrapper
    with pytest.raises(ValueError):
        i18n.translate_printed(lang="xx")


def _stream_lines(path: Path) -> list[str]:
    nb = json.loads(path.read_text(encoding="utf-8"))
    return [ln for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])
            if o.get("output_type") == "stream" and o.get("name") == "stdout"
            for ln in "".join(o["text"]).splitlines()]


def test_the_chinese_notebooks_print_in_chinese():
    """The stored Chinese notebooks hold no line an English template makes that has a different translation; and
    the templates are the notebooks' own: most of them make a line the stored English notebooks print (the rest
    belong to branches this machine does not take: a GPU, another CPU class, a missing package)."""
    templates = [(i18n._pattern(i18n.template_parts(m.id)), m.id) for m in T._read("zh")
                 if m.context == i18n.PRINTED and m.id and m.string and m.string != m.id]
    left = [(p.name, ln) for p in sorted((ROOT / "notebooks" / "zh").glob("[0-9][0-9]_*.ipynb"))
            for ln in _stream_lines(p) if any(pat.fullmatch(ln) for pat, _ in templates)]
    assert not left, f"{len(left)} English lines in the Chinese notebooks' outputs, e.g. {left[:3]}"
    english = [ln for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")) for ln in _stream_lines(p)]
    seen = [t for pat, t in templates if any(pat.fullmatch(ln) for ln in english)]
    assert len(seen) > 0.75 * len(templates), f"only {len(seen)} of {len(templates)} templates match a printed line"
