"""scripts/gpu_check.py's summary table on hand-written step records and logs (the GPU check
itself runs on a GPU, or on the CPU as a slow test)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)

METRICS = """epoch,step,train/loss,train/tokens_per_sec,val/loss
0,9,5.0,1000.0,
0,19,4.0,3000.0,
0,19,,,3.5
0,29,3.0,2000.0,
"""


def fake_out(tmp_path: Path) -> Path:
    (tmp_path / "steps.tsv").write_text(
        "install\t0\t12\ncuda_tests\t0\t5\nquickstart\t0\t200\nsample\t0\t3\nddp\t1\t9\n"
        "speed\t124\t240\nfsdp\tskip:no CUDA device\t0\n"
    )
    (tmp_path / "install.log").write_text("noise\ncdlm /tmp/site/cdlm/__init__.py torch 2.11\n")
    (tmp_path / "cuda_tests.log").write_text("ssss\n======= 4 skipped in 0.20s =======\n")
    (tmp_path / "quickstart_metrics.csv").write_text(METRICS)
    (tmp_path / "sample.log").write_text(
        "text\ncdlm-sample: 8 samples, sampler=rolling, NFE=16, 16.28s\nmore text\n"
    )
    rows = [{"name": "AR", "batch": 16, "device": "cuda", "tokens_per_sec": [900.0, 1e4, 2e4]}]
    (tmp_path / "ddp.log").write_text("Traceback...\nValueError: bad ckpt\n")
    (tmp_path / "speed.json").write_text(json.dumps(rows))
    return tmp_path


def test_the_summary_reads_every_steps_status_and_figures(tmp_path):
    rows = {r["step"]: r for r in gpu_check.summary(fake_out(tmp_path))}
    assert [r["status"] for r in rows.values()] == [
        "ok",
        "skipped (every test: no CUDA device)",
        "ok",
        "ok",
        "FAILED (rc 1)",
        "timeout (rc 124)",
        "skipped (no CUDA device)",
    ]
    assert rows["install"]["figures"].startswith("cdlm /tmp/site")
    # 30 optimizer steps (steps 0..29), tokens/s 1k / 2k / 3k, the last losses of each kind
    assert rows["quickstart"]["figures"] == (
        "30 steps (last logged + 1); tokens/s min/med/max 1.0k / 2.0k / 3.0k; "
        "train/loss 3.000 @ 29; val/loss 3.500 @ 19"
    )
    assert rows["sample"]["figures"] == "cdlm-sample: 8 samples, sampler=rolling, NFE=16, 16.28s"
    assert rows["ddp"]["figures"] == "ValueError: bad ckpt"  # a failure: its log's last line
    assert rows["speed"]["figures"] == "AR b16 cuda: 0.9k / 10.0k / 20.0k tok/s"
    assert json.loads((tmp_path / "summary.json").read_text()) == list(rows.values())
    table = (tmp_path / "summary.md").read_text().splitlines()
    assert len(table) == 2 + 7 and table[4].startswith("| quickstart | ok | 200 |")


def test_spread_text_keeps_small_numbers_as_they_are():
    assert gpu_check.spread_text([3.0, 1.0, 2.0]) == "1.0 / 2.0 / 3.0"
    assert gpu_check.spread_text([]) == "n/a"


@pytest.mark.slow
def test_the_whole_check_runs_on_the_cpu_and_skips_the_cuda_parts(tmp_path):
    """The whole script with short budgets: every step that needs no GPU passes."""
    env = os.environ | {
        "OUT": str(tmp_path / "out"),
        "RUNS": str(tmp_path / "runs"),
        "SITE": str(tmp_path / "site"),
        "TRAIN_SECONDS": "15",
        "SPEED_TRAIN_SECONDS": "8",
        "STEPS": "3",
        "SAMPLE_STEPS": "16",
        "SPEED_REPEATS": "1",
        "PRECISION": "32-true",
        "SLACK": "300",
        "BUDGET_SECONDS": "3000",
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHON": sys.executable,
    }
    subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=ROOT, env=env, check=True, timeout=900)
    rows = json.loads((tmp_path / "out" / "summary.json").read_text())
    status = {r["step"]: r["status"] for r in rows}
    assert status.pop("cuda_tests").startswith("skipped") and status.pop("fsdp").startswith(
        "skipped"
    )
    assert set(status.values()) == {"ok"}, rows
