"""Sweeps: Hydra launchers through the real CLI, the sweep configs, their table (cdlm-table), the W&B
sweep files as the agent runs them, and what a W&B run records (docs/guide/sweeps.md)."""

import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import TINY_TRAIN, run_cli
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from lightning.pytorch.loggers import CSVLogger
from omegaconf import OmegaConf

from cdlm import config_dir
from cdlm.cli.train import validate
from cdlm.configs import compose_checked
from cdlm.processes import MaskedProcess
from cdlm.run.build import build_logger

ROOT = Path(__file__).resolve().parents[1]
SWEEP_CONFIGS = sorted(p.stem for p in (config_dir() / "experiment").glob("sweep_*.yaml"))
WANDB_SWEEPS = sorted((ROOT / "experiments" / "sweeps").glob("*.yaml"))
TINY = [o for o in TINY_TRAIN if not o.startswith(("trainer.max_steps", "trainer.val_check"))]
TINY += ["trainer.max_steps=2", "trainer.val_check_interval=2"]


def compose_train(*overrides: str):
    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        return compose("train", overrides=list(overrides), return_hydra_config=True)


def sweep_table(folder: Path) -> list[dict]:
    """The multirun's rows as ``cdlm-table`` collects them (the console command, as users run it)."""
    result = subprocess.run(
        [sys.executable, "-m", "cdlm.cli.table", str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout == (folder / "table.md").read_text()
    return json.loads((folder / "table.json").read_text())["rows"]


def check_rows(rows: list[dict], processes: list[str]) -> None:
    assert [r["varying"]["process"] for r in rows] == processes
    for row in rows:
        assert row["status"] == "finished" and row["steps"] == 2
        for key in ("val/loss", "val/bits_per_token", "final/bits_per_token"):
            assert math.isfinite(row["metrics"][key]), (key, row)


@pytest.mark.slow  # two training jobs in joblib workers: ~25 s; run by .ci/run's slow pass
def test_joblib_multirun_then_one_table(tiny_corpus, tmp_path):
    sweep = tmp_path / "multirun"
    result = run_cli(
        "cdlm-train",
        "-m",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        f"data.path={tiny_corpus}",
        *TINY,
        "process=masked,autoregressive",  # both log val/bits_per_token
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for job in ("0", "1"):  # each job trained in, and locked, its own folder
        assert (sweep / job / "model.safetensors").is_file()
        assert (sweep / job / ".cdlm.lock").is_file()
    assert not (sweep / ".cdlm.lock").exists()
    check_rows(sweep_table(sweep), ["masked", "autoregressive"])
    table = (sweep / "table.md").read_text()
    assert "| 0 | masked | finished | 2 |" in table
    assert "| 1 | autoregressive | finished | 2 |" in table
    assert all(
        r["cost"]["parallel_jobs"] == 2
        for r in json.loads((sweep / "table.json").read_text())["rows"]
    )


@pytest.mark.slow  # submitit's local executor: the code path of submitit_slurm, without SLURM
def test_submitit_multirun(tiny_corpus, tmp_path):
    sweep = tmp_path / "multirun"
    result = run_cli(
        "cdlm-train",
        "-m",
        "hydra/launcher=submitit_local",
        "hydra.launcher.timeout_min=5",
        f"data.path={tiny_corpus}",
        *TINY,
        "process=masked,autoregressive",
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    check_rows(sweep_table(sweep), ["masked", "autoregressive"])


@pytest.mark.parametrize("launcher", ["joblib", "submitit_slurm", "submitit_local"])
def test_launcher_plugins_compose_beside_the_packaged_configs(launcher):
    cfg = compose_train(f"hydra/launcher={launcher}", "experiment=sweep_quickstart")
    assert cfg.hydra.launcher._target_.startswith("hydra_plugins.")


def grid(params: dict[str, str]) -> list[list[str]]:
    """Every job's overrides of a Hydra basic-sweeper ``params`` block."""
    parser = OverridesParser.create()
    axes = [
        [f"{key}={v}" for v in parser.parse_override(f"{key}={values}").sweep_string_iterator()]
        for key, values in params.items()
    ]
    return [list(job) for job in itertools.product(*axes)]


@pytest.mark.parametrize("experiment", SWEEP_CONFIGS)
def test_every_job_of_a_sweep_config_passes_validation(experiment):
    params = compose_train(f"experiment={experiment}").hydra.sweeper.params
    jobs = grid(dict(params))
    assert len(jobs) > 1
    for job in jobs:  # cdlm-train validates the command line only, not the sweeper's jobs
        overrides = [f"experiment={experiment}", *job]
        cfg = compose_checked("train", overrides)
        validate(cfg, overrides)
        assert cfg.trainer.max_time == "00:00:10:00"  # the quickstart budget


def agent_command(sweep: dict, params: dict) -> list[str]:
    """The command line ``wandb agent`` runs for one parameter set: wandb's own helpers, then
    the macro substitution of ``wandb_agent.Agent._command_run`` (not importable on its own)."""
    from wandb.sdk.launch.sweeps.utils import create_sweep_command, create_sweep_command_args

    macros = create_sweep_command_args({"args": {k: {"value": v} for k, v in params.items()}})
    macros |= {"env": ["/usr/bin/env"], "interpreter": ["python"], "program": [sweep["program"]]}
    command = []
    for c in map(str, create_sweep_command(sweep["command"])):
        is_macro = c.startswith("${") and c.endswith("}")
        command += (macros.get(c[2:-1]) or []) if is_macro else [c]
    return command


def parameter_sets(parameters: dict) -> list[dict]:
    """Enough parameter sets that every listed value, and each end of each range, is used."""
    choices = {}
    for name, spec in parameters.items():
        if "value" in spec:
            choices[name] = [spec["value"]]
        elif "values" in spec:
            choices[name] = spec["values"]
        else:
            assert spec["distribution"] in ("log_uniform_values", "uniform", "int_uniform"), spec
            choices[name] = [spec["min"], spec["max"]]
    n = max(len(v) for v in choices.values())
    return [{k: v[i % len(v)] for k, v in choices.items()} for i in range(n)]


@pytest.mark.parametrize("path", WANDB_SWEEPS, ids=lambda p: p.name)
def test_wandb_sweep_commands_are_valid_cdlm_train_commands(path, monkeypatch):
    sweep = yaml.safe_load(path.read_text())
    assert sweep["method"] in ("grid", "random", "bayes") and sweep["metric"]["name"]
    monkeypatch.setenv("WANDB_SWEEP_ID", "sw33p")  # what the agent exports to each run
    monkeypatch.setenv("WANDB_RUN_ID", "r1")
    for params in parameter_sets(sweep["parameters"]):
        command = agent_command(sweep, params)
        assert command[:2] == ["/usr/bin/env", "cdlm-train"], command
        overrides = command[2:]
        assert all(f"{k}={v}" in overrides for k, v in params.items())
        cfg = compose_checked("train", overrides)
        validate(cfg, overrides)
        assert cfg.logger._target_.endswith("WandbLogger")
        run_dir = compose_train(*overrides).hydra.run.dir
        assert run_dir == "outputs/wandb/sw33p/r1"  # one folder per run, never shared


def task_config(tmp_path: Path, *overrides: str):
    """The config a cdlm-train job gets (no hydra node), with Hydra's runtime set as in a job."""
    cfg = compose_train(*overrides)
    OmegaConf.update(cfg, "hydra.runtime.output_dir", str(tmp_path), force_add=True)
    HydraConfig.instance().set_config(cfg)
    return OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])


def wandb_logger(tmp_path: Path, *overrides: str):
    cfg = task_config(tmp_path, "logger=wandb", *overrides)
    return cfg, build_logger(cfg, MaskedProcess(vocab_size=10, mask_id=9))


def test_wandb_run_carries_config_process_kind_and_group(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_SWEEP_ID", raising=False)
    cfg, logger = wandb_logger(tmp_path, "experiment=quickstart", "process=masked")
    init = logger._wandb_init
    assert init["group"] == "quickstart"  # outside a W&B sweep: the run's (experiment's) name
    assert init["config"]["process_kind"] == "cdlm.processes.masked.MaskedProcess"
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert {k: v for k, v in init["config"].items() if k != "process_kind"} == resolved
    assert init["config"]["trainer"]["max_time"] == "00:00:10:00"

    monkeypatch.setenv("WANDB_SWEEP_ID", "sw33p")
    assert wandb_logger(tmp_path)[1]._wandb_init["group"] == "sw33p"
    # a logger without a `config` key gets none (CSVLogger would refuse it)
    assert isinstance(build_logger(task_config(tmp_path, "logger=csv"), None), CSVLogger)


def test_offline_wandb_runs_record_the_commit_and_one_run_per_job(tmp_path, monkeypatch):
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SWEEP_ID", "sw33p")
    monkeypatch.chdir(ROOT)  # W&B reads the commit of the folder the run starts in
    first = wandb_logger(tmp_path / "0", "process=masked")[1].experiment
    # the next job of a multirun in the same process (basic launcher, a joblib worker)
    second = wandb_logger(tmp_path / "1", "process=masked")[1].experiment
    try:
        assert second.id != first.id  # Lightning would reuse the open run
        assert second.settings.git_commit == head.stdout.strip()
        assert second.group == "sw33p"
        assert second.config["process_kind"] == "cdlm.processes.masked.MaskedProcess"
        assert second.config["process"]["_target_"] == "cdlm.processes.masked.MaskedProcess"
    finally:
        second.finish()
