"""scripts/gpu_learning.sh (issue 49 item 8): its pairing of each Austen lever with its
process's default on hand-written bounds, and, slow, the whole script in its CPU dry mode: every
step of the GPU study (install, tokenizer, both multiruns, the paired bounds, the archive) with a
tiny model, corpus and budget, the archive unpacking into folders that cdlm-table reads."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import experiment_module

from cdlm.run.record import Cost, Record, write
from cdlm.run.table import collect

ROOT = Path(__file__).resolve().parents[1]
gpu_learning = experiment_module("gpu_learning", "scripts")
AUSTEN = ["masked", "masked_bell", "masked_flat", "masked_complementary", "masked_clipped", "gaussian",
          "gaussian_self_cond", "gaussian_bell", "uniform", "uniform_bell", "uniform_flat",
          "uniform_curriculum"]  # fmt: skip


def fake_job(folder: Path, recipe: str, bits: list[list[float]], *more: str) -> None:
    """A finished job whose bound is cached: groups of 10 and 30 tokens."""
    overrides = [f"recipe={recipe}", *more]
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    write(folder, Record("cdlm-train", overrides, Cost(), steps=100))
    (folder / "model.safetensors").write_bytes(b"")  # never read: bound.json is the cache
    record = {"bits": bits, "tokens": [10, 30], "sequences": 4, "draws": len(bits)}
    (folder / "bound.json").write_text(json.dumps(record))


def test_a_lever_is_paired_with_its_process_default(tmp_path):
    """Gain = default minus lever, token-weighted over groups (weights 1/4, 3/4), draws averaged
    first: differences (-0.5, 0) give +0.125 bits, SE sqrt(2 * sum w^2 (d - mean)^2) = 0.1875."""
    fake_job(tmp_path / "austen" / "0", "masked", [[2.0, 3.0], [2.0, 3.0]])
    fake_job(tmp_path / "austen" / "1", "masked_flat", [[1.0, 3.5], [2.0, 2.5]])
    fake_job(tmp_path / "austen" / "2", "gaussian_bell", [[5.0, 5.0]])  # no default: unpaired
    fake_job(tmp_path / "austen" / "3", "uniform", [[6.0, 6.0]])
    fake_job(tmp_path / "start" / "masked", "masked", [[1.0, 1.0]], "process.shift=false")
    fake_job(tmp_path / "start" / "uniform", "uniform", [[7.0, 5.0]], "init_from=m.safetensors")
    rows = {r["recipe"]: r for r in gpu_learning.bounds(tmp_path, draws=2, sequences=4, group=2)}
    lever = rows["masked_flat"]
    assert lever["world"] == "austen" and lever["process"] == "masked"
    assert lever["paired_gain_bits"] == pytest.approx(0.125, abs=1e-12)
    assert lever["paired_gain_se"] == pytest.approx(0.1875, abs=1e-12)
    assert lever["bound_bits"] == pytest.approx(0.25 * 1.5 + 0.75 * 3.0, abs=1e-12)
    assert "paired_gain_bits" not in rows["masked"] | rows["gaussian_bell"]
    # the start (less time than the sweep's masked) is no lever; uniform from it is
    assert "paired_gain_bits" not in rows["masked_unshifted"]
    start = rows["uniform_from_masked"]
    assert start["process"] == "uniform" and start["sweep"] == "start"
    assert start["paired_gain_bits"] == pytest.approx(6.0 - (0.25 * 7.0 + 0.75 * 5.0), abs=1e-12)
    assert "| austen | masked_flat |  | 100 | 2.6250 ± " in gpu_learning.table(list(rows.values()))


@pytest.mark.slow
def test_the_dry_run_trains_scores_and_archives_every_job(tmp_path):
    out = tmp_path / "out"
    env = os.environ | {
        "DRY": "1",
        "OUT": str(out),
        "RUNS": str(tmp_path / "runs"),
        "SITE": str(tmp_path / "site"),
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHON": sys.executable,
    }
    subprocess.run(["bash", "scripts/gpu_learning.sh"], cwd=ROOT, env=env, check=True, timeout=1500)
    rows = json.loads((out / "learning_gpu.json").read_text())
    austen = {r["recipe"]: r for r in rows if r["sweep"] == "austen"}
    assert sorted(austen) == sorted(AUSTEN)
    for recipe, row in austen.items():  # each lever paired with its process's default
        paired = "paired_gain_bits" in row
        assert paired == (recipe not in ("masked", "gaussian", "uniform")), row
        assert row["bound_se"] > 0 and row["draws"] == 2
    start = {r["recipe"]: r for r in rows if r["sweep"] == "start"}
    assert sorted(start) == ["masked_unshifted", "uniform_from_masked"]
    assert "paired_gain_bits" in start["uniform_from_masked"]
    crossover = [(r["recipe"], r["train_size"]) for r in rows if r["sweep"] == "crossover"]
    assert len(crossover) == 6 and {s for _, s in crossover} == {"8", "16"}
    unpacked = tmp_path / "unpacked"
    with tarfile.open(out / "learning.tgz") as archive:
        archive.extractall(unpacked, filter="data")
    for sweep, jobs in (("austen", len(AUSTEN)), ("start", 2), ("crossover", 6)):
        table = collect([unpacked / sweep])
        assert len(table["rows"]) == jobs
        assert {r["status"] for r in table["rows"]} == {"finished"}
        assert all("val/loss" in r["metrics"] and r["steps"] for r in table["rows"])
