"""One Hydra choice switches the paradigm: masked and autoregressive models via the CLI."""

import json

import pytest
from conftest import run_cli


@pytest.mark.parametrize("sampler", ["ancestral", "cached_ancestral", "confidence", "threshold"])
def test_masked_model_samples(tiny_masked_checkpoint, tmp_path, sampler):
    out = tmp_path / "s.jsonl"
    result = run_cli(
        "cdlm-sample",
        f"ckpt={tiny_masked_checkpoint}",
        f"sampler={sampler}",
        "steps=8",
        "num_samples=2",
        f"out={out}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(records) == 2 and records[0]["sampler"] == sampler
    # the tiny masked recipe predicts shifted (an AR phase): its network also runs a BOS position
    assert 1 <= records[0]["nfe"] <= 8 and records[0]["positions"] == records[0]["nfe"] * 17


def test_masked_block_sampling_from_the_cli(tiny_masked_checkpoint, tmp_path):
    result = run_cli(
        "cdlm-sample",
        f"ckpt={tiny_masked_checkpoint}",
        "sampler=confidence",
        "sampler.block_length=4",
        "steps=8",
        "num_samples=1",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]


def test_ar_model_samples_with_kv_cache(tiny_ar_checkpoint, tmp_path):
    out = tmp_path / "s.jsonl"
    result = run_cli(
        "cdlm-sample",
        f"ckpt={tiny_ar_checkpoint}",
        "sampler=ar",
        "num_samples=2",
        f"out={out}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    record = json.loads(out.read_text().splitlines()[0])
    assert record["positions"] == record["nfe"] <= 16


@pytest.mark.parametrize(
    "ckpt, sampler, fits",
    [
        (
            "tiny_masked_checkpoint",
            "ddpm",
            "ancestral, cached_ancestral, confidence, entropy_bounded, threshold",
        ),
        ("tiny_ar_checkpoint", "confidence", "use one of: ar"),
        ("tiny_checkpoint", "ar", "ddim, ddpm"),
    ],
)
def test_incompatible_sampler_is_refused(ckpt, sampler, fits, request, tmp_path):
    path = request.getfixturevalue(ckpt)
    out = tmp_path / "s.jsonl"
    result = run_cli(
        "cdlm-sample", f"ckpt={path}", f"sampler={sampler}", f"out={out}", cwd=tmp_path
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not fit" in lines[0] and fits in lines[0], lines
    assert not out.exists()


def test_masked_training_logs_the_bound(tiny_masked_checkpoint):
    metrics = (tiny_masked_checkpoint.parent / "csv" / "version_0" / "metrics.csv").read_text()
    for key in ("val/bits_per_token", "val/ce_t0.5", "val/acc_t0.9"):
        assert key in metrics
