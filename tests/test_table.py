"""cdlm-table: a two-job multirun of tiny models collected into JSON and markdown with its
overrides, metrics, steps, CPU seconds and commit; a rerun skips the finished jobs; an eval
multirun's jobs are rows too; a W&B run file reads as its CSV twin (cdlm.run.logs)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY_TRAIN, run_main

from cdlm.cli import table as table_cli
from cdlm.run import logs, record

ROOT = Path(__file__).resolve().parents[1]
TINY = [o for o in TINY_TRAIN if not o.startswith(("trainer.max_steps", "trainer.val_check"))]
TINY += [
    "trainer.max_steps=2",
    "trainer.val_check_interval=2",
    "+trainer.enable_progress_bar=false",
]


def head() -> str | None:
    found = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return found.stdout.strip() if found.returncode == 0 else None


@pytest.fixture(scope="module")
def sweep(tiny_corpus, tmp_path_factory) -> Path:
    """Two tiny jobs of one multirun (the basic launcher: in this process, one after the other),
    started from the repository so that each records its commit."""
    folder = tmp_path_factory.mktemp("multirun")
    args = ["-m", f"data.path={tiny_corpus}", *TINY, "process=masked,autoregressive"]
    result = run_main("cdlm-train", *args, "resume=auto", f"hydra.sweep.dir={folder}", cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    return folder


def test_a_multirun_is_one_table_of_its_jobs(sweep, capsys):
    table_cli.main([str(sweep)])
    printed = capsys.readouterr().out
    table = json.loads((sweep / "table.json").read_text())
    assert (sweep / "table.md").read_text() == printed
    rows = table["rows"]
    assert [r["job"] for r in rows] == ["0", "1"]
    assert table["varying"] == ["process"]
    assert [r["varying"]["process"] for r in rows] == ["masked", "autoregressive"]
    assert table["shared"]["trainer.max_steps"] == "2" and table["shared"]["resume"] == "auto"
    for row in rows:
        assert row["status"] == "finished" and row["steps"] == 2
        assert row["cost"]["cpu_seconds"] > 0 and row["cost"]["parallel_jobs"] == 1
        assert row["metrics"]["val/bits_per_token"] > 0
        assert row["metrics"]["final/bits_per_token"] > 0
        if head():
            assert row["commit"].split("+")[0] == head()
    assert "| 0 | masked | finished | 2 |" in printed
    assert "| 1 | autoregressive | finished | 2 |" in printed


def test_a_rerun_skips_the_finished_jobs(sweep, tiny_corpus):
    before = {job: (sweep / job / "run.json").read_text() for job in ("0", "1")}
    args = ["-m", f"data.path={tiny_corpus}", *TINY, "process=masked,autoregressive"]
    result = run_main("cdlm-train", *args, "resume=auto", f"hydra.sweep.dir={sweep}", cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("finished (2 steps); skipped") == 2, result.stdout[-2000:]
    assert {job: (sweep / job / "run.json").read_text() for job in ("0", "1")} == before


def test_an_eval_multirun_is_rows_of_the_same_table(sweep, tmp_path, capsys):
    """cdlm-eval -m over checkpoints (the sweep's two models) and a sampler option."""
    folder = tmp_path / "evals"
    ckpts = f"ckpt={sweep / '0'},{sweep / '1'}"
    args = ["scorer=none", "num_samples=2", "repeats=1", "num_batches=1", "wandb=false"]
    result = run_main(
        "cdlm-eval", "-m", ckpts, *args, "steps=2,3", f"hydra.sweep.dir={folder}", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert not (sweep / "0" / "eval.json").exists()  # each job's report in its own folder
    table_cli.main([str(folder), "--metrics", "speed/steady/nfe/median"])
    rows = json.loads((folder / "table.json").read_text())["rows"]
    assert [r["command"] for r in rows] == ["cdlm-eval"] * 4
    assert [Path(r["varying"]["ckpt"]).name + r["varying"]["steps"] for r in rows] == [
        "02",
        "03",
        "12",
        "13",
    ]
    assert all(r["status"] == "finished" and r["cost"]["cpu_seconds"] > 0 for r in rows)
    masked_nfe = [r["metrics"]["speed/steady/nfe/median"] for r in rows[:2]]
    assert masked_nfe == [2.0, 3.0]  # the masked model's steps; the AR model ignores them
    assert "speed/steady/nfe/median" in capsys.readouterr().out


def test_no_jobs_is_a_one_line_error(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "cdlm.cli.table", str(tmp_path)], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "no jobs" in result.stderr


def test_steps_are_the_finished_optimizer_steps(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    for n in (5, 12):
        (tmp_path / "checkpoints" / f"step-{n}.ckpt").write_bytes(b"")
    assert record.steps(tmp_path) == 12  # a run cut short: its newest checkpoint
    card = {"card": {"training": {"steps": 20}}}
    (tmp_path / "config.json").write_text(json.dumps(card))
    assert record.steps(tmp_path) == 20  # the card, written at the end of training
    record.write(tmp_path, record.Record("cdlm-train", [], record.Cost(), steps=21))
    assert record.steps(tmp_path) == 21  # run.json, the one definition


WANDB_RUN = """
import sys, wandb
run = wandb.init(project="t", dir=sys.argv[1], settings=wandb.Settings(console="off"))
for i in range(3):
    run.log({"val/loss": 1.0 / (i + 1), "trainer/global_step": i})
run.log({"train/flops": 3e12, "trainer/global_step": 3})
run.finish()
"""


def test_a_wandb_run_file_reads_as_its_rows(tmp_path):
    """An offline W&B run, written by a fresh interpreter as a job writes it."""
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", WANDB_RUN, str(tmp_path)], env=env, timeout=120)
    assert done.returncode == 0
    assert len(logs.wandb_files(tmp_path)) == 1
    rows = logs.rows(tmp_path)
    assert rows == [
        {"val/loss": 1.0, "step": 0.0},
        {"val/loss": 0.5, "step": 1.0},
        {"val/loss": 1 / 3, "step": 2.0},
        {"train/flops": 3e12, "step": 3.0},
    ]
    assert logs.curve(rows, "val/loss") == [(0, 1.0), (1, 0.5), (2, 1 / 3)]


def test_an_eval_rerun_with_resume_auto_redoes_only_the_unfinished_jobs(tmp_path):
    """A killed grid: job 1 wrote no run.json (killed before its end), so the rerun redoes it
    and skips job 0, whose report and record stay as they were."""
    folder = tmp_path / "evals"
    args = ["ckpt=world:chars", "process=masked", "scorer=world", "num_samples=2", "wandb=false"]
    args += ["steps=2,3", "resume=auto", f"hydra.sweep.dir={folder}"]
    assert run_main("cdlm-eval", "-m", *args, cwd=tmp_path).returncode == 0
    kept = {p: p.read_text() for p in sorted((folder / "0").iterdir())}
    (folder / "1" / "run.json").unlink()
    report = next((folder / "1").glob("*.json"))
    report.write_text("{half")
    result = run_main("cdlm-eval", "-m", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("finished; skipped") == 1, result.stdout[-2000:]
    assert {p: p.read_text() for p in sorted((folder / "0").iterdir())} == kept
    assert (folder / "1" / "run.json").is_file() and json.loads(report.read_text())


def test_eval_resume_takes_auto_or_nothing(tmp_path):
    result = run_main(
        "cdlm-eval", "ckpt=world:chars", "process=masked", "resume=last", cwd=tmp_path
    )
    assert (
        result.returncode == 2 and "unknown resume 'last'; valid: auto (or null)" in result.stderr
    )
