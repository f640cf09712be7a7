"""``cdlm-sample`` with labels, guidance scales, prompts, infilling and editing, end to end."""

from __future__ import annotations

import json

import pytest

from cdlm.cli.sample import layout_of, validate
from cdlm.configs import compose_checked
from cdlm.generation.inputs import read_layout
from cdlm.model_file import load_model
from cdlm.regions import parse_template
from cdlm.validation import UsageError
from tests.conftest import run_main

FAST = ["steps=2", "num_samples=2", "progress=false"]


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def one_line_error(result, *needles):
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(lines) == 1 and all(n in lines[0] for n in needles), lines


@pytest.mark.parametrize(
    "ckpt", ["tiny_checkpoint", "tiny_masked_checkpoint", "tiny_ar_checkpoint"]
)
def test_a_list_of_scales_gives_one_record_per_sample_and_scale(ckpt, request, tmp_path):
    path = request.getfixturevalue(ckpt)
    out = tmp_path / "s.jsonl"
    result = run_main(
        "cdlm-sample",
        f"ckpt={path}",
        "label=emma",
        "guidance.scale=[0,1,2.5]",
        *FAST,
        f"out={out}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows = records(out)
    assert [(r["scale"], r["label"]) for r in rows] == [
        (w, "emma") for w in (0.0, 0.0, 1.0, 1.0, 2.5, 2.5)
    ]
    nfe = {r["scale"]: r["nfe"] for r in rows}
    assert nfe[2.5] == 2 * nfe[1.0]  # guidance costs two network passes per step


def test_multirun_sweep_writes_one_output_per_scale(tiny_masked_checkpoint, tmp_path):
    sweep = tmp_path / "sweep"
    result = run_main(
        "cdlm-sample",
        "-m",
        f"ckpt={tiny_masked_checkpoint}",
        "label=persuasion",
        "guidance.scale=0,1,2,4",
        *FAST,
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    files = sorted(sweep.glob("*/samples.jsonl"))
    assert len(files) == 4
    assert sorted(records(f)[0]["scale"] for f in files) == [0.0, 1.0, 2.0, 4.0]


@pytest.mark.parametrize(
    "template, fixed_texts",
    [
        ("Em [[2]], [[ok]]\tné.", ["Em ", ", ", "\tné."]),
        ("Em [[2]], [[ok]] [[3]]", ["Em ", ", ", " "]),
    ],
    ids=["fixed-end", "gap-end"],
)
@pytest.mark.parametrize(
    "ckpt", ["tiny_checkpoint", "tiny_masked_checkpoint", "tiny_fim_checkpoint"]
)
def test_infill_keeps_fixed_text_and_maps_regions(ckpt, template, fixed_texts, request, tmp_path):
    """The output is the template's regions and ends where the template ends (the tiny BPE is
    near character level: 14 tokens each, and the models' seq_len is 16)."""
    path = request.getfixturevalue(ckpt)
    out = tmp_path / "s.jsonl"
    result = run_main(
        "cdlm-sample",
        f"ckpt={path}",
        f'infill="{template}"',
        *FAST,
        f"out={out}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    for r in records(out):
        fixed = [g for g in r["regions"] if g["kind"] == "fixed"]
        assert [g["text"] for g in fixed] == fixed_texts
        assert [tuple(g["input"]) for g in r["regions"]] == [
            (seg.start, seg.end) for seg in parse_template(template)
        ]
        for g in r["regions"]:
            a, b = g["output"]
            assert r["text"][a:b] == g["text"]
            if g["kind"] == "fixed":
                assert template[g["input"][0] : g["input"][1]] == g["text"]
        last = r["regions"][-1]
        assert last["input"][1] == len(template) and last["output"][1] == len(r["text"])
        assert last["tokens"][1] == len(r["token_ids"]) < 16  # nothing after the template
        if template.endswith("."):
            assert r["text"].endswith("\tné.") and last["kind"] == "fixed"
        else:
            assert last["kind"] == "generated" and last["tokens"][1] - last["tokens"][0] == 3


def test_edit_file_regenerates_only_its_spans(tiny_masked_checkpoint, tmp_path):
    source = tmp_path / "letter.txt"
    source.write_text("Anne, [[fine]] and well.\n", encoding="utf-8")
    out = tmp_path / "s.jsonl"
    result = run_main(
        "cdlm-sample",
        f"ckpt={tiny_masked_checkpoint}",
        f"edit={source}",
        "edit_strength=0.5",
        *FAST,
        f"out={out}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    for r in records(out):
        assert r["text"].startswith("Anne, ") and r["text"].endswith(" and well.\n")
        fixed = [g["text"] for g in r["regions"] if g["kind"] == "fixed"]
        assert fixed == ["Anne, ", " and well.\n"] and r["regions"][-1]["kind"] == "fixed"


@pytest.mark.parametrize(
    "args, needles",
    [
        (["prompt=" + "the morning was fine " * 20], ["longer than the canvas", "16"]),
        (["label=ulysses"], ["unknown label 'ulysses'", "emma, persuasion"]),
        (["label=emma", "guidance.scale=-1"], ["guidance.scale must be >= 0"]),
    ],
)
def test_input_errors_are_one_line(tiny_masked_checkpoint, tmp_path, args, needles):
    out = tmp_path / "s.jsonl"
    result = run_main(
        "cdlm-sample", f"ckpt={tiny_masked_checkpoint}", *args, *FAST, f"out={out}", cwd=tmp_path
    )
    one_line_error(result, *needles)
    assert not out.exists()


@pytest.mark.parametrize(
    "args, needles",
    [
        (['infill="Mr [[4]] ' + "and then " * 20 + '"'], ["longer than the canvas"]),
        (["label=emma", "guidance.scale=[1,-0.5]"], ["guidance.scale must be >= 0"]),
        (['infill="oops [[3 and more"'], ["never closed", "character 5"]),
        (["prompt=a", "infill='b [[2]]'"], ["at most one of prompt=, infill=, edit="]),
        (["edit=/no/such/file.txt"], ["edit file not found"]),
        (["edit_strength=0"], ["edit_strength must be in (0, 1]"]),
        (["temperature=0"], ["temperature must be > 0"]),
    ],
)
def test_more_input_errors_name_the_problem(tiny_masked_checkpoint, args, needles):
    """The same checks in-process (each CLI start costs seconds): validation, then reading the
    canvas and label against the loaded model."""
    cfg = compose_checked("sample", [f"ckpt={tiny_masked_checkpoint}", *args])
    model = load_model(tiny_masked_checkpoint)
    with pytest.raises(UsageError) as err:
        validate(cfg)
        layout_of(cfg, model, model.config["seq_len"])
    message = str(err.value)
    assert "\n" not in message and all(n in message for n in needles), message


def test_max_new_tokens_sizes_the_canvas_after_the_prompt(tiny_ar_checkpoint, tmp_path):
    """prompt= with max_new_tokens=N: a canvas of the prompt's tokens and N more; the AR
    baseline prefills the prompt in one call, so it makes at most N + 1 calls."""
    args = [f"ckpt={tiny_ar_checkpoint}", "prompt=the morning", "max_new_tokens=5"]
    cfg = compose_checked("sample", args)
    validate(cfg)
    model = load_model(tiny_ar_checkpoint)
    canvas = layout_of(cfg, model, model.config["seq_len"])
    prompt = sum(not e for e in canvas.editable)
    assert prompt >= 1 and len(canvas.ids) == prompt + 5 and all(canvas.editable[prompt:])
    out = tmp_path / "s.jsonl"
    result = run_main("cdlm-sample", *args, *FAST, f"out={out}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert all(r["text"].startswith("the morning") and r["nfe"] <= 6 for r in records(out))


def test_read_layout_sizes_only_a_prompt_by_seq_len(tiny_masked_checkpoint):
    """A template's canvas is its regions whatever seq_len (which only bounds it); a prompt's
    runs to seq_len; max_new_tokens, which sizes what follows a prompt, is refused without one."""
    model = load_model(tiny_masked_checkpoint)
    template = "Emma [[2]] né."  # 11 tokens
    for kind in ("infill", "edit"):
        exact, bound = (read_layout(model, n, **{kind: template}) for n in (11, 16))
        assert exact == bound and len(bound.ids) == 11 and not bound.editable[-1]
    prompt = read_layout(model, 16, prompt="Emma")
    assert len(prompt.ids) == 16 and prompt.editable[-1]
    with pytest.raises(ValueError, match="max_new_tokens counts the tokens after a prompt"):
        read_layout(model, 16, infill=template, max_new_tokens=4)


@pytest.mark.parametrize(
    "args, needles",
    [
        (["max_new_tokens=4"], ["counts the tokens after prompt="]),
        (["prompt=a", "max_new_tokens=4", "seq_len=8"], ["not both"]),
        (["prompt=a", "max_new_tokens=0"], ["max_new_tokens"]),
        (["prompt=a", "max_new_tokens=500"], ["more than the model's 16"]),
    ],
)
def test_bad_max_new_tokens_is_named(tiny_masked_checkpoint, args, needles):
    cfg = compose_checked("sample", [f"ckpt={tiny_masked_checkpoint}", *args])
    model = load_model(tiny_masked_checkpoint)
    with pytest.raises(UsageError) as err:
        validate(cfg)
        layout_of(cfg, model, model.config["seq_len"])
    assert all(n in str(err.value) for n in needles), str(err.value)
