"""``cdlm-eval``'s dispatch: a metric or task is its config's ``_target_``, called with the one
``Metric`` signature, and the model is loaded (and its sampler chosen) once per report."""

from __future__ import annotations

import inspect
import json
import sys
from collections import Counter

import pytest
from conftest import run_main
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

import cdlm.cli.eval  # noqa: F401  every module cdlm-eval uses, imported before the spies go in
from cdlm import config_dir
from cdlm.evaluation.metric import Loaded, Measured
from cdlm.generation import choose
from cdlm.model_file import load_model

METRICS = sorted(p.stem for p in (config_dir() / "metric").glob("*.yaml"))
CALLS: list[tuple] = []


def spy_metric(loaded: Loaded, cfg, **options) -> Measured:
    """A metric that records how it was called (``metric._target_=test_eval_dispatch.spy_metric``)."""
    CALLS.append((loaded, cfg, options))
    return Measured("spy", {"options": options}, "cdlm-eval: the spy ran")


@pytest.fixture
def counts(monkeypatch) -> Counter:
    """Calls of ``load_model`` and ``choose``, wherever a cdlm module holds them."""
    seen: Counter = Counter()
    for original in (load_model, choose):

        def spy(*args, _original=original, **kwargs):
            seen[_original.__name__] += 1
            return _original(*args, **kwargs)

        for module in list(sys.modules.values()):
            if getattr(module, "__name__", "").startswith("cdlm"):
                if getattr(module, original.__name__, None) is original:
                    monkeypatch.setattr(module, original.__name__, spy)
    return seen


@pytest.mark.parametrize("metric", METRICS)
def test_every_metric_config_builds_a_metric_of_the_one_signature(metric):
    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        cfg = compose("eval", overrides=[f"metric={metric}", "ckpt=x"])
    measure = instantiate(cfg.metric)
    inspect.signature(measure).bind("loaded", "cfg")  # Metric: (loaded, cfg) -> Measured
    assert measure.func.__name__ == metric  # its reports are named by it (eval_<metric>.json)


def test_the_metric_target_is_what_runs(tiny_checkpoint, tmp_path):
    CALLS.clear()
    out = tmp_path / "spy.json"
    result = run_main(
        "cdlm-eval",
        f"ckpt={tiny_checkpoint}",
        "metric._target_=test_eval_dispatch.spy_metric",
        "+metric.flavour=mint",
        f"out={out}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ((loaded, cfg, options),) = CALLS
    assert isinstance(loaded, Loaded) and loaded.ckpt == str(tiny_checkpoint)
    assert cfg.ckpt == str(tiny_checkpoint) and options == {"flavour": "mint"}
    assert json.loads(out.read_text()) == {"options": {"flavour": "mint"}}
    assert "cdlm-eval: the spy ran" in result.stdout


@pytest.mark.parametrize(
    "ckpt, args",
    [
        ("tiny_masked_checkpoint", ["sampler=confidence", "num_samples=2", "repeats=1"]),
        ("tiny_checkpoint", ["metric=elbo", "metric.t_samples=1"]),
        ("tiny_masked_checkpoint", ["task=write", "task.samples=2", "cases=2"]),
        (
            "tiny_masked_checkpoint",
            ["metric=frontier", "metric.temperatures=[0.5,1]", "num_samples=2"],
        ),
    ],
    ids=["report", "elbo", "task", "frontier"],
)
def test_the_model_loads_once_and_its_sampler_is_chosen_once(
    ckpt, args, counts, request, tiny_corpus, tmp_path
):
    result = run_main(
        "cdlm-eval",
        f"ckpt={request.getfixturevalue(ckpt)}",
        *args,
        "steps=2",
        "scorer=none",
        "batch_size=2",
        "num_batches=1",
        f"data.path={tiny_corpus}",
        "wandb=false",
        f"out={tmp_path / 'r.json'}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert counts == {"load_model": 1, "choose": 1}
