"""The reading of experiments/continuous.py (temperature grid, matched-entropy frontier) and
experiments/distill.py (goals per method, hand-written prose kept) on hand-made rows."""

import argparse
import json
from pathlib import Path

import pytest
from test_speed_table import _script

continuous = _script("continuous", "experiments")
distill = _script("distill", "experiments")
ROOT = Path(__file__).resolve().parents[1]


def test_grid_is_every_step_count_at_t1_then_the_temperatures_at_the_frontier_steps():
    args = argparse.Namespace(
        steps=[16, 64], temperatures=[0.7, 1.0], frontier_steps=64, samplers=[]
    )
    assert [(c[0], c[3], c[4]) for c in continuous.configs("masked", args)] == [
        ("ancestral", 16, 1.0),
        ("ancestral", 64, 1.0),
        ("ancestral", 64, 0.7),
    ]
    assert [(c[3], c[4]) for c in continuous.configs("autoregressive", args)] == [
        (1, 1.0),
        (1, 0.7),
    ]
    gaussian = continuous.configs("gaussian", args)
    assert len(gaussian) == 3 * len(continuous.SAMPLERS["gaussian"])
    args.samplers = ["ddpm", "rolling"]  # a subset; a process with none of them keeps its own
    assert {c[1] for c in continuous.configs("gaussian", args)} == {"ddpm", "rolling"}
    assert {c[1] for c in continuous.configs("masked", args)} == {"ancestral"}


def _row(recipe, process, sampler, steps, t, ppl, entropy):
    return {
        "recipe": recipe,
        "process": process,
        "sampler": sampler,
        "steps": steps,
        "temperature": t,
        "gen_ppl": ppl,
        "entropy": entropy,
        "reference_entropy": 7.75,
        "reference_gen_ppl": 67.0,
    }


def test_frontier_reads_each_curve_at_the_masked_entropy():
    rows = [
        _row("masked", "masked", "ancestral", 64, 1.0, 1000.0, 8.0),
        _row("masked", "masked", "ancestral", 64, 0.7, 300.0, 7.0),
        _row("g", "gaussian", "ddpm", 64, 1.0, 4000.0, 8.5),
        _row("g", "gaussian", "ddpm", 64, 0.7, 400.0, 7.5),
        _row("g", "gaussian", "ddpm", 16, 1.0, 9.0, 1.0),  # another step count: not on the curve
        _row("ar", "autoregressive", "ar", 1, 1.0, 250.0, 7.9),
    ]
    args = argparse.Namespace(frontier_steps=64, temperatures=[0.7, 1.0])
    lines = continuous.frontier(rows, args).splitlines()
    ddpm = next(line for line in lines if line.startswith("| g | ddpm"))
    # masked's entropy 8.0 sits halfway between 7.5 and 8.5: sqrt(400 * 4000) = 1265
    assert ddpm == "| g | ddpm | 1265 | 711 |"  # 7.75: a quarter of the way: 400 * 10^0.25
    assert "| masked | ancestral | 1000 | 740 |" in lines  # 7.75: 3/4 of the way from 7 to 8
    assert "| ar | ar | n/a | n/a |" in lines  # one temperature: no bracket


def _d(role, method, sampler, steps, ppl, entropy=8.0):
    return {
        "process": "gaussian",
        "role": role,
        "method": method,
        "sampler": sampler,
        "steps": steps,
        "gen_ppl": ppl,
        "entropy": entropy,
        "reference_entropy": 8.0,
    }


def test_goals_are_per_method_and_say_met_only_when_met():
    rows = [
        _d("teacher", "none", "ddim", 64, 1000.0),
        _d("teacher", "none", "rolling", 64, 500.0),
        _d("teacher", "none", "ddim", 8, 2000.0),
        _d("teacher", "none", "ddim", 4, 3000.0),
        _d("student", "a", "ddim", 8, 900.0),
        _d("student", "a", "ddim", 4, 3100.0),
        _d("student", "b", "ddim", 8, 950.0, entropy=7.0),  # below 0.95x the entropy
        _d("student", "b", "ddim", 4, 10.0, entropy=0.5),  # a collapse
        _d("teacher", "none", "ddim", 1, 400.0, entropy=0.1),
        _d("student", "b", "ddim", 1, 10.0, entropy=0.6),  # both below half real text's 8 bits
    ]
    text = "\n".join(distill.goals(rows))
    a, b = text.split("**gaussian, b:**")
    assert "8-step student (900 at 8.00 bits) vs the teacher at 64 steps with ddim" in a
    assert "gen-PPL 0.90x (goal <= 1.00x), entropy 1.00x (goal >= 0.95x): **met**" in a
    assert "gen-PPL 1.80x" in a and "**not met**" in a  # against rolling, its best sampler
    assert "8: 900 against 2000 (beats); 4: 3100 against 3000 (does not beat)" in a
    assert "entropy 0.88x (goal >= 0.95x): **not met**" in b
    assert "**met**" not in b
    assert "4: 10 against 3000 (lower only at 0.06x its entropy: not a win)" in b
    assert "1: 10 against 400 (both collapsed: 0.60 and 0.10 bits, so no comparison)" in b


def test_regenerating_keeps_the_hand_written_reading(tmp_path):
    doc = tmp_path / "distillation.md"
    doc.write_text(f"old table\n{distill.GENERATED_END}\n## Reading\nkept\n")
    assert distill.with_prose(doc, f"new table\n{distill.GENERATED_END}\n") == (
        f"new table\n{distill.GENERATED_END}\n## Reading\nkept\n"
    )
    assert distill.with_prose(tmp_path / "none.md", "t\n") == "t\n"


def test_recipe_of_reads_the_run_overrides(tmp_path):
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text("- experiment=quickstart\n- recipe=xpred\n")
    assert distill.recipe_of(str(tmp_path / "model.safetensors")) == "xpred"
    assert distill.recipe_of(str(tmp_path / "x" / "model.safetensors")) == "unknown"


@pytest.mark.parametrize("name", ["continuous", "distillation"])
def test_the_shipped_tables_carry_the_fields_a_reader_compares(name):
    rows = json.loads((ROOT / "docs" / "results" / f"{name}.json").read_text())["rows"]
    needed = {"process", "recipe", "sampler", "steps", "temperature", "bits_per_token"}
    needed |= {"gen_ppl", "entropy"}
    assert rows and all(needed <= set(r) for r in rows)


@pytest.mark.parametrize("kind", ["gaussian", "masked"])
def test_a_temperature_goes_to_the_x0_softmax_for_gaussian_and_to_the_token_sampler(
    kind, tiny_checkpoint, tiny_masked_checkpoint
):
    # the 40-minute sweep crashed here once: a masked model's temperature went to the process
    ckpt = tiny_checkpoint if kind == "gaussian" else tiny_masked_checkpoint
    name = "ddpm" if kind == "gaussian" else "ancestral"
    args = argparse.Namespace(num_samples=2, likelihood_sequences=2, likelihood_draws=1)
    report = continuous.measure(str(ckpt), kind, (name, {}, 2, 0.8), args, None, 1)
    sampler = report["sampler"]
    if kind == "gaussian":
        assert sampler["temperature"] == 0.8 and sampler["options"].get("temperature", 1.0) == 1.0
    else:
        assert sampler["temperature"] == 1.0 and sampler["options"]["rule"]["temperature"] == 0.8


def test_a_seed_replicate_is_its_own_section_and_leaves_seed_0_rows_standing(tmp_path):
    old = [{"budget_minutes": 10.0, "recipe": "today", "gen_ppl": 1.0}]  # before --seed: seed 0
    (tmp_path / "c.json").write_text(json.dumps({"rows": old}))
    again = [{"budget_minutes": 10.0, "seed": 1, "recipe": "today", "gen_ppl": 2.0}]
    assert continuous.merged(tmp_path / "c.json", again) == old + again
    retrained = [{"budget_minutes": 10.0, "seed": 0, "recipe": "today", "gen_ppl": 3.0}]
    assert continuous.merged(tmp_path / "c.json", retrained) == retrained
    md = tmp_path / "c.md"
    md.write_text("prose\n" + continuous.begin(10) + "\nT0\n" + continuous.END + "\nmore\n")
    doc = continuous.with_table(md, "T1\n", 10, seed=1)
    assert "T0" in doc and "T1" in doc and doc.index("T0") < doc.index("T1")
    md.write_text(doc)
    doc = continuous.with_table(md, "T1b\n", 10, seed=1)
    assert "T1\n" not in doc and "T1b" in doc and "T0" in doc and "more" in doc
