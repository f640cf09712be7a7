"""``world_options``: a world built from the user's own corpus (or other options) through every
command, one name for all of them, with one-line errors and the options in the cache key."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from conftest import TINY_TRAIN, run_main
from omegaconf import OmegaConf
from test_cli import assert_one_line_error

from cdlm import config_dir, worlds
from cdlm.model_file import load_model

CORPUS = "abab abba baba ab ba abab baab\nab ba abab aab bba\n"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("own") / "corpus.txt"
    path.write_text(CORPUS, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus) -> Path:
    """A 3-step masked model on the character world fitted on ``corpus``, given by a path
    relative to the command's folder."""
    run_dir = tmp_path_factory.mktemp("run")
    (run_dir / "corpus.txt").write_text(corpus.read_text())
    result = run_main(
        "cdlm-train",
        "data=world",
        "data.world=world:chars",
        "data.world_options.path=corpus.txt",
        "process=masked",
        *(o for o in TINY_TRAIN if not o.startswith("data.vocab_size")),
        "data.val_size=4",
        "callbacks.model_folder.bound_sequences=0",
        "+trainer.enable_progress_bar=false",
        f"hydra.run.dir={run_dir}",
        cwd=run_dir,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir / "model.safetensors"


def own_rate(corpus: Path, length: int) -> float:
    return worlds.load("world:chars", path=str(corpus)).entropy_rate(length) / math.log(2)


def test_a_model_trained_on_an_own_corpus_world_records_it_and_is_scored_by_it(
    trained, corpus, tmp_path
):
    model = load_model(trained)
    recorded = model.config["world_options"]
    assert model.config["world"] == "world:chars"
    assert recorded == {"path": str((trained.parent / "corpus.txt").resolve())}
    out = tmp_path / "eval.json"
    args = ("scorer=world", "num_samples=2", "steps=4", "repeats=1", "num_batches=1")
    result = run_main(
        "cdlm-eval", f"ckpt={trained}", *args, "batch_size=2", "wandb=false", f"out={out}",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    bound = json.loads(out.read_text())["likelihood"]
    bundled = worlds.load("world:chars").entropy_rate(16) / math.log(2)
    assert bound["entropy_rate_bits"] == pytest.approx(own_rate(corpus, 16), abs=1e-12)
    assert abs(bound["entropy_rate_bits"] - bundled) > 1.0  # two letters, not Austen's 27


def test_the_oracle_of_an_own_corpus_world_samples_and_scores_that_world(corpus, tmp_path):
    out = tmp_path / "s.jsonl"
    given = f"world_options.path={corpus}"
    sampled = run_main(
        "cdlm-sample", "ckpt=world:chars", "process=masked", given, "num_samples=2", "steps=16",
        "progress=false", f"out={out}", cwd=tmp_path,
    )  # fmt: skip
    assert sampled.returncode == 0, sampled.stderr[-3000:]
    texts = [json.loads(line)["text"] for line in out.read_text().splitlines()]
    assert len(texts) == 2 and set("".join(texts)) <= set("ab ")
    report = tmp_path / "eval.json"
    args = ("scorer=world", "num_samples=2", "steps=8", "repeats=1", "wandb=false")
    evaluated = run_main(
        "cdlm-eval", "ckpt=world:chars", "process=masked", given, *args, "batch_size=2",
        "num_batches=1", f"out={report}", cwd=tmp_path,
    )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    quality = json.loads(report.read_text())["quality"]
    assert quality["world"]["options"] == {"path": str(corpus.resolve())}
    assert quality["world"]["entropy_rate_bits"] == pytest.approx(own_rate(corpus, 128))


@pytest.mark.parametrize(
    "prog, args, message",
    [
        (
            "cdlm-sample",
            ("ckpt=world:chars", "process=masked", "world_options.names=3"),
            "world world:chars has no option 'names'; valid: path, length, smoothing",
        ),
        (
            "cdlm-eval",
            ("ckpt=world:chars", "process=masked", "world_options.colour=3"),
            "unknown config option 'world_options.colour'; options at world_options: path",
        ),
        (
            "cdlm-train",
            ("data=world", "data.world=world:agreement", "data.world_options.top_k=3"),
            "world world:agreement has no option 'top_k'; valid: names, period",
        ),
    ],
)
def test_an_unknown_world_option_is_named_in_one_line(prog, args, message, tmp_path):
    result = run_main(prog, *args, f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert_one_line_error(result, message)


def test_world_options_on_a_model_file_are_refused(trained, tmp_path):
    args = (f"ckpt={trained}", "world_options.path=corpus.txt", "num_samples=1")
    result = run_main("cdlm-sample", *args, cwd=tmp_path)
    assert_one_line_error(result, "world_options apply to ckpt=world:<name>")


def test_options_are_part_of_the_cache_key(corpus, tmp_path, monkeypatch):
    own = worlds.load("world:chars", path=str(corpus))
    assert worlds.load("chars", path=str(corpus)) is own  # the same options: built once
    assert worlds.load("world:chars", path=str(corpus), smoothing=1e-3) is not own
    assert worlds.load("world:chars") is not own and own.options == {"path": str(corpus)}
    copy = tmp_path / "corpus.txt"
    copy.write_text(CORPUS)
    monkeypatch.chdir(tmp_path)  # a relative path is the same corpus as its absolute one
    relative = worlds.load("world:chars", path="corpus.txt")
    assert worlds.load("world:chars", path=str(copy)) is relative
    copy.write_text(CORPUS.replace("b", "a"))  # changed: fitted again
    os.utime(copy, ns=(1, 1))
    changed = worlds.load("world:chars", path="corpus.txt")
    assert changed is not relative and changed.entropy_rate() < relative.entropy_rate()


def test_every_commands_world_options_are_every_worlds_options():
    """One name everywhere: a new option of a conf/world/ file must be added to each command."""
    every = {k for name in worlds.names() for k in worlds.option_names(name)}
    for file, node in (("sample", "world_options"), ("eval", "world_options")) + (
        ("data/world", "world_options"),
    ):
        cfg = OmegaConf.load(config_dir() / f"{file}.yaml")
        assert set(cfg[node]) == every, file
        assert all(v is None for v in cfg[node].values())
