"""One Hydra choice switches the paradigm: masked and autoregressive models via the CLI."""

import json
import re

import pytest
from conftest import run_main
from test_cli import check_samples, read_records

from cdlm.model_file import load_model


@pytest.mark.parametrize("sampler", ["ancestral", "cached_ancestral", "confidence", "threshold"])
def test_masked_model_samples(tiny_masked_checkpoint, tmp_path, sampler):
    out = tmp_path / "s.jsonl"
    result = run_main(
        "cdlm-sample",
        f"ckpt={tiny_masked_checkpoint}",
        f"sampler={sampler}",
        "steps=8",
        "num_samples=2",
        f"out={out}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    records = read_records(out)
    check_samples(records, load_model(tiny_masked_checkpoint), 2, sampler, 8)
    # the tiny masked recipe predicts shifted (an AR phase): its network also runs a BOS position
    assert 1 <= records[0]["nfe"] <= 8 and records[0]["positions"] == records[0]["nfe"] * 17


def test_masked_block_sampling_from_the_cli(tiny_masked_checkpoint, tmp_path):
    """block_length=4 with steps=8 on the 16-token canvas: 4 blocks of 2 steps each, left to
    right, so the canvas file's commit order puts every position in its own block's steps
    (the sampler may stop early at EOS: positions never committed are -1)."""
    out, canvas = tmp_path / "s.jsonl", tmp_path / "c.html"
    result = run_main(
        "cdlm-sample",
        f"ckpt={tiny_masked_checkpoint}",
        "sampler=confidence",
        "sampler.block_length=4",
        "steps=8",
        "num_samples=2",
        f"out={out}",
        f"canvas={canvas}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    records = read_records(out)
    check_samples(records, load_model(tiny_masked_checkpoint), 2, "confidence", 8)
    assert records[0]["nfe"] in (2, 4, 6, 8)  # whole blocks
    data = json.loads(re.search(r"const D = (.*);\n", canvas.read_text()).group(1))
    for sample in data["samples"]:
        order = sample["order"]
        assert len(order) == 16 and order[0] in (0, 1), order
        assert all(k == -1 or k // 2 == i // 4 for i, k in enumerate(order)), order


def test_ar_model_samples_with_kv_cache(tiny_ar_checkpoint, tmp_path):
    out = tmp_path / "s.jsonl"
    result = run_main(
        "cdlm-sample",
        f"ckpt={tiny_ar_checkpoint}",
        "sampler=ar",
        "num_samples=2",
        f"out={out}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    records = read_records(out)
    check_samples(records, load_model(tiny_ar_checkpoint), 2, "ar", 64)  # the default steps
    record = records[0]
    assert record["positions"] == record["nfe"] <= 16


@pytest.mark.parametrize(
    "ckpt, sampler, fits",
    [
        (
            "tiny_masked_checkpoint",
            "ddpm",
            "ancestral, cached_ancestral, confidence, entropy_bounded, exact_k, remdm, threshold",
        ),
        ("tiny_ar_checkpoint", "confidence", "use one of: ar"),
        ("tiny_checkpoint", "ar", "ddim, ddpm"),
    ],
)
def test_incompatible_sampler_is_refused(ckpt, sampler, fits, request, tmp_path):
    path = request.getfixturevalue(ckpt)
    out = tmp_path / "s.jsonl"
    result = run_main(
        "cdlm-sample", f"ckpt={path}", f"sampler={sampler}", f"out={out}", cwd=tmp_path
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not fit" in lines[0] and fits in lines[0], lines
    assert not out.exists()


def test_masked_training_logs_the_bound(tiny_masked_checkpoint):
    """The masked ELBO in bits per token (finite and positive) beside the per-level figures."""
    import csv
    import math

    with (tiny_masked_checkpoint.parent / "csv" / "version_0" / "metrics.csv").open() as f:
        seen = {k: float(v) for row in csv.DictReader(f) for k, v in row.items() if v != ""}
    assert math.isfinite(seen["val/bits_per_token"]) and seen["val/bits_per_token"] > 0
    assert math.isfinite(seen["val/ce_t0.5"]) and seen["val/ce_t0.5"] > 0
    assert 0 <= seen["val/acc_t0.9"] <= 1
