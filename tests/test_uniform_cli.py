"""process=uniform from the command line: cdlm-train builds and trains it at tiny size, and
cdlm-sample draws from the model with its default sampler (duo_ancestral)."""

import csv
import math

import pytest
from conftest import run_main, train_tiny
from test_cli import check_samples, read_records

from cdlm.model_file import load_model


def test_uniform_trains_and_samples(tmp_path_factory, tiny_corpus, tmp_path):
    ckpt = train_tiny(tmp_path_factory, tiny_corpus, "process=uniform")
    model = load_model(ckpt)
    assert model.process.kind == "uniform" and model.process.default_sampler == "duo_ancestral"
    tok = model.tokenizer  # text packs EOS, so the noise support keeps it and drops pad and mask
    assert model.config["process"]["excluded"] == sorted([tok.pad_token_id, tok.mask_token_id])
    with (ckpt.parent / "csv" / "version_0" / "metrics.csv").open() as f:
        seen = {k: float(v) for row in csv.DictReader(f) for k, v in row.items() if v != ""}
    assert math.isfinite(seen["val/bits_per_token"]) and seen["val/bits_per_token"] > 0
    assert seen["step"] == 3 and math.isfinite(seen["val/ce_t0.5"])  # 3 steps, per-level figures
    out = tmp_path / "s.jsonl"
    result = run_main(
        "cdlm-sample", f"ckpt={ckpt}", "steps=4", "num_samples=2", f"out={out}", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-2000:]
    records = read_records(out)
    check_samples(records, model, 2, "duo_ancestral", 4)
    assert records[0]["nfe"] == 4
    refused = run_main("cdlm-sample", f"ckpt={ckpt}", "sampler=ancestral", cwd=tmp_path)
    assert refused.returncode == 2 and "use one of: duo_ancestral" in refused.stderr


def test_uniform_trains_with_the_gaussian_curriculum(tmp_path_factory, tiny_corpus):
    # 3 steps with share 0.5: steps 0 and 1 (progress 0, 1/3) read relaxed inputs and log their
    # temperature, step 2 (progress 2/3) the exact corruption
    ckpt = train_tiny(
        tmp_path_factory, tiny_corpus, "process=uniform", "process.curriculum.share=0.5"
    )
    assert load_model(ckpt).process.curriculum.share == 0.5
    with (ckpt.parent / "csv" / "version_0" / "metrics.csv").open() as f:
        rows = [{k: float(v) for k, v in r.items() if v != ""} for r in csv.DictReader(f)]
    taus = {r["step"]: r["train/curriculum_tau"] for r in rows if "train/curriculum_tau" in r}
    assert taus == pytest.approx({0: 1e-3, 1: 1e-3, 2: 0.0}), taus  # 0: the exact corruption
    trained = [r for r in rows if "train/loss" in r]
    assert len(trained) == 3 and all(math.isfinite(r["train/loss"]) for r in trained)
    val = [r for r in rows if "val/bits_per_token" in r]
    assert (
        val and math.isfinite(val[-1]["val/bits_per_token"]) and val[-1]["val/curriculum_tau"] == 0
    )
