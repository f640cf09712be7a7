"""``cdlm-eval`` end to end on the tiny checkpoint, and its one-line errors."""

import json
import os
import subprocess
import sys

import pytest
from test_cli import assert_one_line_error


def run_eval(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "cdlm.cli.eval", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ | {"PYTHONWARNINGS": "ignore"},
    )


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
    assert f"cdlm-eval: {metric} on 2 sequences" in result.stdout


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
