"""The command-line interface end to end, and its one-line errors."""

import json

import pytest
from conftest import TINY_TRAIN, run_cli


def assert_one_line_error(result, *fragments):
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [ln for ln in result.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_sample_end_to_end(tiny_checkpoint, tmp_path):
    out = tmp_path / "samples.jsonl"
    args = (
        f"ckpt={tiny_checkpoint}",
        "sampler=ddim",
        "steps=4",
        "num_samples=3",
        "seed=0",
        f"out={out}",
    )
    result = run_cli("cdlm-sample", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 3
    for r in records:
        assert {"text", "token_ids", "sampler", "steps", "nfe", "wall_seconds"} <= set(r)
        assert r["sampler"] == "ddim" and r["steps"] == 4 and r["nfe"] == 4
        assert r["text"] in result.stdout
    # same seed, same samples; DDPM also runs
    again = tmp_path / "again.jsonl"
    run_cli("cdlm-sample", *args[:-1], f"out={again}", cwd=tmp_path)
    again_ids = [json.loads(x)["token_ids"] for x in again.read_text().splitlines()]
    assert again_ids == [r["token_ids"] for r in records]
    ddpm = run_cli(
        "cdlm-sample",
        f"ckpt={tiny_checkpoint}",
        "sampler=ddpm",
        "steps=3",
        "num_samples=2",
        cwd=tmp_path,
    )
    assert ddpm.returncode == 0 and "NFE=3" in ddpm.stdout


def test_train_on_user_text_writes_a_model(tiny_checkpoint):
    assert tiny_checkpoint.stat().st_size > 0
    metrics = (tiny_checkpoint.parent / "csv" / "version_0" / "metrics.csv").read_text()
    for key in ("train/loss", "val/loss", "val/ce_t0.1", "val/acc_t0.5", "val/acc_t0.9"):
        assert key in metrics


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["ckpt=missing.safetensors"], ["checkpoint not found", "missing.safetensors"]),
        (["ckpt=CORRUPT"], ["cannot read checkpoint"]),
        (["ckpt=CKPT", "steps=0"], ["steps must be >= 1"]),
        (["ckpt=CKPT", "num_samples=0"], ["num_samples must be >= 1"]),
        (["ckpt=CKPT", "seq_len=0"], ["seq_len must be >= 1"]),
        (["ckpt=CKPT", "stepz=3"], ["unknown config option 'stepz'", "steps"]),
        (["ckpt=CKPT", "sampler=nope"], ["sampler/nope", "ddim", "ddpm"]),
        (["ckpt=CKPT", "rounding=cubic"], ["rounding", "argmax, nearest"]),
        ([], ["ckpt=PATH is required"]),
    ],
)
def test_sample_bad_input(args, fragments, tiny_checkpoint, tmp_path):
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(b"not a checkpoint at all")
    out = tmp_path / "out.jsonl"
    args = [a.replace("CKPT", str(tiny_checkpoint)).replace("CORRUPT", str(corrupt)) for a in args]
    result = run_cli("cdlm-sample", *args, f"out={out}", cwd=tmp_path)
    assert_one_line_error(result, *fragments)
    assert not out.exists() and not list(tmp_path.glob(".out.jsonl*"))


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["data.seq_len=0"], ["data.seq_len must be >= 2"]),
        (["data.batchsize=3"], ["unknown config option 'data.batchsize'", "batch_size"]),
        (["process=nope"], ["process/nope", "gaussian"]),
        (["process.objective=l1"], ["unknown objective 'l1'", "ce, mse"]),
        (["trainer.max_steps=0"], ["trainer.max_steps must be >= 1"]),
    ],
)
def test_train_bad_input(args, fragments, tiny_corpus, tmp_path):
    result = run_cli(
        "cdlm-train",
        f"data.path={tiny_corpus}",
        *TINY_TRAIN,
        *args,
        f"hydra.run.dir={tmp_path}",
        cwd=tmp_path,
    )
    assert_one_line_error(result, *fragments)
    assert not (tmp_path / "model.safetensors").exists()
