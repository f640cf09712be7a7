"""process=uniform from the command line: cdlm-train builds and trains it at tiny size, and
cdlm-sample draws from the model with its default sampler (duo_ancestral)."""

import csv
import math

from conftest import run_main, train_tiny
from test_cli import check_samples, read_records

from cdlm.model_file import load_model


def test_uniform_trains_and_samples(tmp_path_factory, tiny_corpus, tmp_path):
    ckpt = train_tiny(tmp_path_factory, tiny_corpus, "process=uniform")
    model = load_model(ckpt)
    assert model.process.kind == "uniform" and model.process.default_sampler == "duo_ancestral"
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
