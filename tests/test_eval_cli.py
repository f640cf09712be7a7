"""``cdlm-eval`` end to end on the tiny checkpoint, and its one-line errors."""

import json
import subprocess
import sys

import pytest
from conftest import run_cli, run_main
from test_cli import assert_one_line_error


def run_eval(*args, cwd):
    return run_main("cdlm-eval", *args, cwd=cwd)


@pytest.mark.parametrize(
    "metric, terms",
    [
        ("elbo", {"prior", "diffusion", "reconstruction", "total"}),
        ("ode_nll", {"flow", "dequantization", "rounding", "total"}),
    ],
)
def test_eval_writes_a_report(tiny_checkpoint, tiny_corpus, tmp_path, metric, terms):
    out = tmp_path / "eval.json"
    result = run_eval(
        f"ckpt={tiny_checkpoint}",
        f"metric={metric}",
        f"data.path={tiny_corpus}",
        "batch_size=2",
        "num_batches=1",
        f"out={out}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["metric"] == metric and report["sequences"] == 2 and report["nfe"] >= 1
    bits = report["bits_per_token"]
    assert set(bits) == terms
    assert bits["total"] == pytest.approx(sum(v for k, v in bits.items() if k != "total"))
    scores = "pure Gaussian noise on every token"  # what the bound is of (a hybrid model's too)
    assert report["scores"].endswith(scores)
    assert f"cdlm-eval: {metric} of " in result.stdout
    assert f"{scores}, on 2 sequences" in result.stdout


def test_eval_bad_input_is_one_line_and_writes_nothing(tiny_checkpoint, tmp_path):
    out = tmp_path / "eval.json"
    result = run_eval(
        f"ckpt={tiny_checkpoint}", "metric=ode_nll", "metric.rtol=-1", f"out={out}", cwd=tmp_path
    )
    assert_one_line_error(result, "metric.rtol must be > 0")
    assert not out.exists()


@pytest.mark.parametrize("metric", ["elbo", "ode_nll"])
def test_metric_configs_compose_and_instantiate(metric):
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from cdlm import config_dir

    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        cfg = compose("eval", overrides=[f"metric={metric}", "ckpt=x"])
    assert instantiate(cfg.metric).func.__name__ == metric


def test_full_report_from_the_cli_and_compare(tiny_masked_checkpoint, tiny_corpus, tmp_path):
    out = tmp_path / "report.json"
    # a real command: its W&B summary (disabled here) must not set up wandb in this process
    result = run_cli(
        "cdlm-eval",
        f"ckpt={tiny_masked_checkpoint}",
        "sampler=confidence",
        "steps=4",
        "num_samples=2",
        "repeats=2",
        "scorer=none",
        f"data.path={tiny_corpus}",
        "batch_size=2",
        "num_batches=1",
        f"out={out}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["sampler"]["name"] == "confidence" and report["batch_size"] == 2
    assert len(report["speed"]["runs"]) == 2 and report["likelihood"]["sequences"] == 2
    assert "real val text" in result.stdout and out.with_suffix(".md").is_file()
    table = subprocess.run(
        [sys.executable, "-m", "cdlm.cli.eval", "--compare", str(out), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert table.returncode == 0 and "| | report | report |" in table.stdout
    assert "| process | masked | masked |" in table.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "cdlm.cli.eval", "--compare", "nope.json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert_one_line_error(missing, "not found", "nope.json")


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["steps=0"], "steps must be >= 1"),
        (["repeats=0"], "repeats must be >= 1"),
        (["grid=zigzag"], "unknown grid 'zigzag'"),
    ],
)
def test_report_bad_input(tiny_checkpoint, tmp_path, args, fragment):
    out = tmp_path / "r.json"
    result = run_eval(f"ckpt={tiny_checkpoint}", *args, f"out={out}", cwd=tmp_path)
    assert_one_line_error(result, fragment)
    assert not out.exists()
