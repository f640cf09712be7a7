"""Concurrent writers: two writers of one path never leave a torn file (docs/guide/reliability.md).

``cdlm-sample out=``, ``cdlm-eval out=``, model export and the tokenizer cache all write through
``cdlm.io.atomic_path``. Two processes rewrite one file while a third reads it: every read is one
writer's whole text. The real two-``cdlm-sample`` race is slow (two interpreters), so it is
marked slow.
"""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import time

import pytest

from cdlm.io import atomic_write_text, folder_lock


def _write_many(path: str, text: str, times: int) -> None:
    for _ in range(times):
        atomic_write_text(path, text)


def test_two_writers_of_one_file_never_tear_it(tmp_path):
    path = tmp_path / "samples.jsonl"
    texts = ["".join(f'{{"writer": {w}, "i": {i}}}\n' for i in range(20_000)) for w in (0, 1)]
    atomic_write_text(path, texts[0])
    context = multiprocessing.get_context("fork")  # pure-Python children: safe to fork
    writers = [context.Process(target=_write_many, args=(str(path), t, 40)) for t in texts]
    for w in writers:
        w.start()
    reads = 0
    while any(w.is_alive() for w in writers):
        assert path.read_text() in texts  # never a mix, never a prefix
        reads += 1
    for w in writers:
        w.join()
        assert w.exitcode == 0
    assert reads > 0 and path.read_text() in texts
    assert not list(tmp_path.glob(".samples.jsonl.*"))  # no temporary file left behind


def test_a_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "out.json"
    atomic_write_text(path, "old")
    with pytest.raises(TypeError):
        atomic_write_text(path, None)
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_the_folder_lock_is_reentrant_and_dies_with_its_holder(tmp_path):
    with folder_lock(tmp_path), folder_lock(tmp_path):  # the same process may nest it
        code = (
            "import sys; from cdlm.io import folder_lock, FolderInUse\n"
            "try:\n    folder_lock(sys.argv[1]).__enter__()\nexcept FolderInUse as e:\n"
            "    print(e)\n"
        )
        out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True)
        assert b"is in use by another run" in out.stdout, out
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from cdlm.io import folder_lock; import time\n"
            f"with folder_lock({str(tmp_path)!r}):\n    print('in', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    assert child.stdout.readline() == b"in\n"
    child.kill()  # SIGKILL: no cleanup runs, the kernel drops the lock
    child.wait()
    deadline = time.monotonic() + 5
    while True:
        try:
            with folder_lock(tmp_path):
                break
        except ValueError:
            assert time.monotonic() < deadline
            time.sleep(0.05)


@pytest.mark.slow
def test_two_cdlm_sample_runs_with_one_out_leave_one_whole_file(tiny_masked_checkpoint, tmp_path):
    out = tmp_path / "samples.jsonl"
    args = [f"ckpt={tiny_masked_checkpoint}", "steps=2", "num_samples=64", f"out={out}"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "cdlm.cli.sample", *args, f"seed={seed}"],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for seed in (1, 2)
    ]
    for p in procs:
        assert p.wait(timeout=600) == 0, p.stderr.read()
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 64 and len({r["seed"] for r in records}) == 1


def test_resume_auto_removes_what_killed_writes_left(tmp_path):
    # found by scripts/crash_kills.py: a kill mid-export left hidden temporaries for good
    from omegaconf import OmegaConf

    from cdlm.run.folder import resume_point

    (tmp_path / "checkpoints").mkdir()
    left = [
        tmp_path / "checkpoints" / ".last.ckpt.x1.tmp",
        tmp_path / "model" / ".model.safetensors.x2.tmp",
        tmp_path / "model" / ".tokenizer.x3.tmp" / "tokenizer.json",
    ]
    for path in left:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("partial")
    kept = [tmp_path / "model" / "model.safetensors", tmp_path / ".hydra" / "config.yaml"]
    for path in kept:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("whole")
    cfg = OmegaConf.create({"resume": "auto", "callbacks": {}})
    assert resume_point(cfg, tmp_path).ckpt is None  # no whole checkpoint yet
    assert not list(tmp_path.rglob("*.tmp")) and all(p.exists() for p in kept)
