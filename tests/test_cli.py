"""The command-line interface end to end, and its one-line errors."""

import json

import pytest
from conftest import TINY_TRAIN, run_cli, run_main


def assert_one_line_error(result, *fragments):
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [ln for ln in result.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def check_samples(records, model, count: int, sampler: str, steps: int):
    """What cdlm-sample promises of each record: ``count`` of them, drawn by ``sampler`` in
    ``steps`` steps, each at most the model's sequence length of ids of its vocabulary, cut
    before the first EOS, its text those ids decoded (special tokens dropped)."""
    tokenizer = model.tokenizer
    assert len(records) == count and [r["index"] for r in records] == list(range(count))
    for r in records:
        assert r["sampler"] == sampler and r["steps"] == steps and r["wall_seconds"] >= 0
        ids = r["token_ids"]
        assert 0 < len(ids) <= model.config["seq_len"] and tokenizer.eos_token_id not in ids, ids
        assert all(0 <= i < len(tokenizer) for i in ids), ids
        assert r["text"] == tokenizer.decode(ids, skip_special_tokens=True).strip()


def read_records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_sample_end_to_end(tiny_checkpoint, tmp_path):
    """The installed command once; the rerun and DDPM in-process (the same ``main``)."""
    from cdlm.model_file import load_model

    model = load_model(tiny_checkpoint)
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
    records = read_records(out)
    check_samples(records, model, 3, "ddim", 4)
    for r in records:
        assert r["nfe"] == 4 and r["seed"] == 0 and f"[{r['index']}] {r['text']}" in result.stdout
    # same seed, same samples; DDPM also runs, one network pass per step
    again = tmp_path / "again.jsonl"
    assert run_main("cdlm-sample", *args[:-1], f"out={again}", cwd=tmp_path).returncode == 0
    assert [r["token_ids"] for r in read_records(again)] == [r["token_ids"] for r in records]
    ddpm_out = tmp_path / "ddpm.jsonl"
    ddpm = run_main(
        "cdlm-sample",
        f"ckpt={tiny_checkpoint}",
        "sampler=ddpm",
        "steps=3",
        "num_samples=2",
        f"out={ddpm_out}",
        cwd=tmp_path,
    )
    assert ddpm.returncode == 0, ddpm.stderr[-3000:]
    check_samples(read_records(ddpm_out), model, 2, "ddpm", 3)
    assert all(r["nfe"] == 3 for r in read_records(ddpm_out)) and "NFE=3" in ddpm.stdout


def test_train_on_user_text_writes_a_model(tiny_checkpoint):
    """The model file holds the network the overrides asked for, and the CSV log holds the
    figures, each in its range: losses finite and positive, accuracies in [0, 1]."""
    import csv
    import math

    from cdlm.model_file import load_model

    model = load_model(tiny_checkpoint)
    assert model.process.kind == "gaussian"
    assert model.config["seq_len"] == 16 and model.config["process"]["vocab_size"] == 300
    assert model.config["network"] | {"d_model": 32, "n_layers": 1} == model.config["network"]
    assert sum(p.numel() for p in model.network.parameters()) > 0
    with (tiny_checkpoint.parent / "csv" / "version_0" / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    seen = {}
    for row in rows:
        seen |= {k: float(v) for k, v in row.items() if v != ""}
    for key in ("train/loss", "val/loss"):
        assert math.isfinite(seen[key]) and seen[key] > 0, (key, seen.get(key))
    # at t = 0.1 the readout skip nearly reads the tokens off the input: CE may round to 0
    assert math.isfinite(seen["val/ce_t0.1"]) and seen["val/ce_t0.1"] >= 0
    for key in ("val/acc_t0.5", "val/acc_t0.9"):
        assert 0 <= seen[key] <= 1, (key, seen[key])
    assert seen["step"] >= 2  # the last of the 3 steps was logged


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
    result = run_main("cdlm-sample", *args, f"out={out}", cwd=tmp_path)
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
    result = run_main(
        "cdlm-train",
        f"data.path={tiny_corpus}",
        *TINY_TRAIN,
        *args,
        f"hydra.run.dir={tmp_path}",
        cwd=tmp_path,
    )
    assert_one_line_error(result, *fragments)
    assert not (tmp_path / "model.safetensors").exists()
