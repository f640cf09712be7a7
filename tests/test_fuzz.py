"""Property-based fuzzing (Hypothesis) of what users hand cdlm: command-line overrides drawn from
each entry point's option rules (``RULES``: wrong types, out-of-range and non-finite numbers,
unknown keys, empty, huge and unicode values), and input files (prompts files, pairs files,
corpora, infill templates, model files: truncated, bit-flipped, a header that lies, a class
outside the allow-list). Every invalid input is refused with exit status 2 and one line, never a
traceback, and nothing is written (docs/guide/reliability.md).

The default suite runs a fixed, derandomised set of examples per property (``EXAMPLES``); the
``slow`` twins draw many more at random (``SLOW_EXAMPLES``)."""

from __future__ import annotations

import json
import math
import os
import struct
import sys
from pathlib import Path

import pytest
from hydra.core.global_hydra import GlobalHydra
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdlm.cli import common
from cdlm.cli import eval as eval_cli
from cdlm.cli import sample as sample_cli
from cdlm.cli import train as train_cli
from cdlm.configs import compose
from cdlm.data.corpus import load_documents
from cdlm.data.pairs import read_pairs
from cdlm.generation.inputs import read_rows
from cdlm.model_file import ModelFileError, check_model_file, load_model
from cdlm.validation import Choice, Flag, Number

EXAMPLES = 25
SLOW_EXAMPLES = 400
QUICK = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
LONG = settings(QUICK, max_examples=SLOW_EXAMPLES, derandomize=False)

ENTRY = {
    "cdlm-train": (train_cli.main, train_cli.RULES, "train"),
    "cdlm-sample": (sample_cli.main, sample_cli.RULES, "sample"),
    "cdlm-eval": (eval_cli.main, eval_cli.RULES, "eval"),
}
# what each entry point needs besides the fuzzed option to get as far as its checks
BASE = {
    "cdlm-train": ["data=world", "data.world=chars", "hydra.run.dir=run"],
    "cdlm-sample": ["ckpt=world:chars", "process=masked"],
    "cdlm-eval": ["ckpt=world:chars", "process=masked", "scorer=none"],
}


class Started(Exception):
    """The command passed its checks and would have started its work."""


def render(value) -> str:
    """A value as the command line would carry it (Hydra's override grammar)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return repr(value)


def outside(rule: Number) -> st.SearchStrategy:
    """Numbers the rule refuses by its range (empty where it has none)."""
    parts = []
    for bound, closed in ((rule.at_least, True), (rule.above, False)):
        if bound is not None:
            top = bound - 1 if closed and rule.integer else bound
            parts.append(st.integers(max_value=int(math.floor(top)), min_value=-(10**30)))
            if not rule.integer:
                parts.append(
                    st.floats(
                        max_value=bound, exclude_max=closed, allow_nan=False, min_value=-1e300
                    )
                )
    for bound, closed in ((rule.at_most, True), (rule.below, False)):
        if bound is not None:
            low = bound + 1 if closed and rule.integer else bound
            parts.append(st.integers(min_value=int(math.ceil(low)), max_value=10**30))
            if not rule.integer:
                parts.append(
                    st.floats(min_value=bound, exclude_min=closed, allow_nan=False, max_value=1e300)
                )
    return st.one_of(*parts) if parts else st.nothing()


WORDS = st.text(
    alphabet=st.characters(codec="utf-8", categories=["L", "M", "N", "S", "P", "Zs"]),
    min_size=1,
    max_size=40,
)


def invalid(rule) -> st.SearchStrategy[str]:
    """Override values (as typed) that ``rule`` must refuse."""
    junk = st.one_of(
        st.sampled_from(["", "''", "abc", "[1,2]", "{a: 1}", "1e999e", "0x10", "☃", "null"]),
        WORDS.filter(lambda w: not _parses_as_number_or_flag(w)),
        st.text(min_size=5000, max_size=20000, alphabet="ab"),  # huge
    )
    if isinstance(rule, Number):
        values = [
            junk.filter(lambda v: not (rule.nullable and v == "null")),
            outside(rule).map(render),
        ]
        values.append(st.sampled_from(["true", "false", "nan"]))
        if rule.integer:
            values.append(
                st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6)
                .filter(lambda x: not float(x).is_integer())
                .map(render)
            )
        return st.one_of(*values)
    if isinstance(rule, Choice):
        return st.one_of(junk, st.sampled_from(["1", "true"])).filter(
            lambda v: v not in list(rule.choices) and not (rule.nullable and v == "null")
        )
    assert isinstance(rule, Flag), rule
    return st.one_of(junk, st.sampled_from(["1", "0", "yes", "no"]))


def _parses_as_number_or_flag(word: str) -> bool:
    if word.strip().lower() in ("true", "false", "null", "nan", "inf", "-inf", "+inf"):
        return True
    try:
        float(word)
        return True
    except ValueError:
        return False


def present(prog: str) -> list[str]:
    """The rule keys an entry point's default config (plus ``BASE``) has."""
    from omegaconf import OmegaConf

    _, rules, name = ENTRY[prog]
    cfg = compose(name, [o for o in BASE[prog] if not o.startswith("hydra.")])
    return [k for k in rules if OmegaConf.select(cfg, k, default="__absent__") != "__absent__"]


KEYS = {prog: present(prog) for prog in ENTRY}


def refuse(prog: str, args: list[str], tmp_path: Path, monkeypatch, capsys) -> str:
    """Runs the entry point in-process in an empty folder; returns the one line it refused
    with, after checking exit status 2, no traceback, no file written and no work started."""
    main, _, _ = ENTRY[prog]
    work = tmp_path / f"cwd{len(list(tmp_path.iterdir()))}"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setattr(sys, "argv", [prog, *BASE[prog], *args])

    def started(*_args, **_kwargs):
        raise Started(args)

    monkeypatch.setattr(common.hydra, "main", started)
    try:
        with pytest.raises(SystemExit) as exit_:
            main()
    finally:
        GlobalHydra.instance().clear()
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert exit_.value.code == 2, (args, err[-2000:])
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), (args, err[-2000:])
    assert "Traceback" not in err
    assert not list(work.rglob("*")), (args, list(work.rglob("*")))
    return lines[0]


def bad_option(draw, prog: str) -> tuple[str, str]:
    key = draw(st.sampled_from(KEYS[prog]))
    return key, draw(invalid(ENTRY[prog][1][key]))


@st.composite
def options(draw):
    prog = draw(st.sampled_from(sorted(ENTRY)))
    return (prog, *bad_option(draw, prog))


def check_option(case, tmp_path, monkeypatch, capsys) -> None:
    prog, key, value = case
    line = refuse(prog, [f"{key}={value}"], tmp_path, monkeypatch, capsys)
    assert key in line or "override" in line.lower(), (key, value[:80], line)


@QUICK
@given(case=options())
def test_an_option_its_rule_refuses_is_one_line_exit_2_naming_the_key(
    case, tmp_path, monkeypatch, capsys
):
    check_option(case, tmp_path, monkeypatch, capsys)


@pytest.mark.slow
@LONG
@given(case=options())
def test_many_options_their_rules_refuse(case, tmp_path, monkeypatch, capsys):
    check_option(case, tmp_path, monkeypatch, capsys)


IDENT = st.from_regex(r"[a-z][a-z0-9_]{0,15}(\.[a-z][a-z0-9_]{0,15}){0,2}", fullmatch=True)


@QUICK
@given(prog=st.sampled_from(sorted(ENTRY)), key=IDENT, value=st.one_of(WORDS, st.just("1")))
def test_an_unknown_option_is_named_in_one_line(prog, key, value, tmp_path, monkeypatch, capsys):
    from omegaconf import OmegaConf

    cfg = compose(ENTRY[prog][2], [o for o in BASE[prog] if not o.startswith("hydra.")])
    first = key.split(".")[0]
    if OmegaConf.select(cfg, key, default="__absent__") != "__absent__" or first in cfg:
        return  # an option that exists (or a group's key): not this property's
    line = refuse(prog, [f"{key}={_quoted(value)}"], tmp_path, monkeypatch, capsys)
    assert f"'{key}'" in line or first in line, (key, line)


def _quoted(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


# --- input files -------------------------------------------------------------------------------

CONTENT = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=300).map(lambda t: t.encode("utf-8")),
    st.lists(
        st.dictionaries(
            st.sampled_from(["prompt", "infill", "max_new_tokens", "response", "x", ""]),
            st.one_of(st.none(), st.booleans(), st.integers(-5, 10**20), st.text(max_size=30)),
            max_size=4,
        ),
        max_size=4,
    ).map(lambda rows: "\n".join(json.dumps(r) for r in rows).encode()),
    st.just(b"x" * 200_000),  # a huge line
    st.text(max_size=50).map(lambda t: t.encode("latin-1", "replace")),
)


def one_line_value_error(read, content: bytes) -> None:
    """``read`` accepts the text or raises a ValueError of one line; nothing else."""
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        return  # the CLI refuses undecodable files before parsing (tested below)
    try:
        read(text)
    except ValueError as e:
        assert "\n" not in str(e) and str(e), repr(e)


@QUICK
@given(content=CONTENT)
def test_prompts_and_pairs_files_are_read_or_refused_in_one_line(content):
    one_line_value_error(read_rows, content)
    one_line_value_error(read_pairs_text, content)


def read_pairs_text(text: str):
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "pairs.jsonl"
        path.write_text(text, encoding="utf-8")
        return read_pairs(path)


@QUICK
@given(content=CONTENT)
def test_a_prompts_file_through_cdlm_sample_is_sampled_or_refused_in_one_line(
    content, tmp_path, monkeypatch, capsys
):
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(content)
    monkeypatch.setattr(sys, "argv", ["cdlm-sample", *BASE["cdlm-sample"], f"prompts={path}"])
    monkeypatch.setattr(sys, "argv", [*sys.argv, "steps=2", f"out={tmp_path / 'out.jsonl'}"])
    (tmp_path / "out.jsonl").unlink(missing_ok=True)
    try:
        with pytest.raises(SystemExit) as exit_:
            sample_cli.main()
            raise SystemExit(0)
    finally:
        GlobalHydra.instance().clear()
    err = capsys.readouterr().err
    assert "Traceback" not in err, err[-2000:]
    if exit_.value.code:
        assert exit_.value.code == 2 and len(err.splitlines()) == 1, err[-2000:]
        assert not (tmp_path / "out.jsonl").exists()


TEMPLATE = st.lists(
    st.one_of(
        st.text(max_size=8),
        st.integers(-3, 40).map(lambda n: f"[[{n}]]"),
        st.sampled_from(["[[", "]]", "[[x]]", "[[]]", "[[1e3]]", "[[99999999999999999999]]"]),
    ),
    max_size=6,
).map("".join)


@QUICK
@given(template=TEMPLATE)
def test_an_infill_template_is_sampled_or_refused_in_one_line(
    template, tmp_path, monkeypatch, capsys
):
    out = tmp_path / "out.jsonl"
    out.unlink(missing_ok=True)
    args = [*BASE["cdlm-sample"], f"infill={_quoted(template)}", "steps=2", "seq_len=32"]
    monkeypatch.setattr(sys, "argv", ["cdlm-sample", *args, f"out={out}"])
    try:
        with pytest.raises(SystemExit) as exit_:
            sample_cli.main()
            raise SystemExit(0)
    finally:
        GlobalHydra.instance().clear()
    err = capsys.readouterr().err
    assert "Traceback" not in err, (template, err[-2000:])
    if exit_.value.code:
        assert exit_.value.code == 2 and len(err.splitlines()) == 1, (template, err[-2000:])
        assert not out.exists()


@QUICK
@given(content=CONTENT)
def test_a_corpus_is_read_or_refused_in_one_line(content, tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    (folder / "a.txt").write_bytes(content)
    try:
        load_documents(str(folder))
    except ValueError as e:
        assert str(e) and "\n" not in str(e), repr(e)


# --- model files -------------------------------------------------------------------------------


@st.composite
def damage(draw, size: int, header: int) -> tuple:
    """A small description of a damage (Hypothesis prints it, not the file): truncation, a bit
    flipped in the header, a header length that lies, or a config naming a class outside the
    allow-list."""
    kind = draw(st.sampled_from(["truncate", "flip", "length", "target"]))
    if kind == "truncate":
        return kind, draw(st.integers(0, size - 1))
    if kind == "flip":
        return kind, draw(st.integers(8, 8 + header - 1)), draw(st.integers(0, 7))
    if kind == "length":
        return kind, draw(st.integers(0, 2**64 - 1).filter(lambda m: m != header))
    targets = ["os.system", "builtins.eval", "subprocess.Popen", "torch.load", "cdlmx.Evil"]
    return kind, draw(st.sampled_from(["network", "process"])), draw(st.sampled_from(targets))


def damaged(data: bytes, how: tuple) -> bytes:
    (n,) = struct.unpack("<Q", data[:8])
    kind, *args = how
    if kind == "truncate":
        return data[: args[0]]
    if kind == "flip":
        at, bit = args
        return data[:at] + bytes([data[at] ^ (1 << bit)]) + data[at + 1 :]
    if kind == "length":
        return struct.pack("<Q", args[0]) + data[8:]
    part, target = args
    header = json.loads(data[8 : 8 + n])
    config = json.loads(header["__metadata__"]["config"])
    config[part]["_target_"] = target
    header["__metadata__"]["config"] = json.dumps(config)
    body = json.dumps(header).encode()
    body += b" " * (-len(body) % 8)
    return struct.pack("<Q", len(body)) + body + data[8 + n :]


def check_damaged(data: bytes, path: Path) -> None:
    path.write_bytes(data)
    try:
        check_model_file(path)
        load_model(path)
    except ModelFileError as e:
        assert str(e) and "\n" not in str(e), repr(e)
    except ValueError as e:  # what the CLI reports in one line, too
        assert str(e) and "\n" not in str(e), repr(e)


@QUICK
@given(data=st.data())
def test_a_damaged_model_file_is_refused_in_one_line_and_runs_no_code(
    data, tiny_masked_checkpoint, tmp_path, monkeypatch
):
    good = Path(tiny_masked_checkpoint).read_bytes()
    (header,) = struct.unpack("<Q", good[:8])
    ran = []
    monkeypatch.setattr(os, "system", lambda *a: ran.append(a))
    how = data.draw(damage(len(good), header))
    check_damaged(damaged(good, how), tmp_path / "model.safetensors")
    assert not ran


@pytest.mark.slow
@LONG
@given(data=st.data())
def test_many_damaged_model_files_are_refused(data, tiny_masked_checkpoint, tmp_path, monkeypatch):
    test_a_damaged_model_file_is_refused_in_one_line_and_runs_no_code.hypothesis.inner_test(
        data, tiny_masked_checkpoint, tmp_path, monkeypatch
    )
