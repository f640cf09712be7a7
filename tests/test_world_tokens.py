"""world:tokens, the token chain over a corpus's own BPE: every learned process trains on it and
``cdlm-eval scorer=world`` scores it (bound, excess, transition KL/TV rates from the sparse
reference). The suite builds it from the tiny corpus at 300 tokens (the full world, 8,192 tokens
over the bundled novels, takes tens of seconds to build: the slow test)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import TINY_TRAIN, run_main

from cdlm import worlds
from cdlm.model_file import load_model
from cdlm.worlds.chain import fit_transition

SMALL = ["data.world_options.vocab_size=300", "data.world_options.top_k=8"]


@pytest.fixture(scope="module")
def small_options(tiny_corpus) -> list[str]:
    return [f"data.world_options.path={tiny_corpus}", *SMALL]


@pytest.mark.parametrize("process", ["masked", "autoregressive", "gaussian", "uniform", "block"])
def test_every_process_trains_on_the_token_world_and_is_scored_by_it(
    process, small_options, tiny_corpus, tmp_path
):
    result = run_main(
        "cdlm-train",
        "data=world:tokens",
        *small_options,
        f"process={process}",
        *(o for o in TINY_TRAIN if not o.startswith("data.vocab_size")),
        "trainer.max_steps=2",
        "data.val_size=4",
        "callbacks.model_folder.bound_sequences=0",
        "+trainer.enable_progress_bar=false",
        f"hydra.run.dir={tmp_path}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    model = load_model(tmp_path / "model.safetensors")
    assert model.config["world"] == "world:tokens"
    world = worlds.recorded(model.config)
    assert world.vocab_size == len(model.tokenizer) == 300 and world.step(1).dense is None
    out = tmp_path / "eval.json"
    args = ("scorer=world", "num_samples=4", "steps=4", "repeats=1", "wandb=false")
    evaluated = run_main(
        "cdlm-eval", f"ckpt={tmp_path}", *args, "batch_size=4", "num_batches=1", f"out={out}",
        cwd=tmp_path,
    )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    report = json.loads(out.read_text())
    samples, reference = report["quality"]["samples"], report["quality"]["reference"]
    bound = report["likelihood"]
    rate = world.entropy_rate(16) / math.log(2)
    assert bound["entropy_rate_bits"] == pytest.approx(rate, abs=1e-12)
    assert bound["excess_bits"] == pytest.approx(bound["bits_per_token"] - rate)
    assert bound["bits_per_token"] > rate  # two steps of training: far above the truth
    for key in ("kl_rate", "tv_rate", "kl_floor", "tv_floor"):
        assert math.isfinite(reference[key]), key
    assert 0 < samples["tv_rate"] <= 1 and reference["violation_rate"] == 0.0
    assert reference["nll_truth"] == pytest.approx(rate, abs=3.0)


def test_a_temperature_sharpens_each_row_to_its_power_before_the_top_k():
    counts = torch.tensor([[6.0, 3.0, 1.0], [1.0, 1.0, 2.0], [0.0, 5.0, 5.0]], dtype=torch.float64)
    p = counts / counts.sum(-1, keepdim=True)
    sharp = fit_transition(counts, 0.0, temperature=0.5).dense
    assert torch.allclose(sharp, p**2 / (p**2).sum(-1, keepdim=True), rtol=1e-12, atol=0)
    top = fit_transition(counts, 0.0, top_k=1, temperature=0.5)  # ties: either, renormalised
    assert torch.equal(top.prob, torch.ones(3, 1, dtype=torch.float64))
    assert top.index[0, 0] == 0 and top.index[1, 0] == 2
    with pytest.raises(ValueError, match="temperature > 0"):
        fit_transition(counts, 0.0, temperature=0.0)


@pytest.mark.slow
def test_the_full_token_world_is_scored_without_a_dense_table():
    """The 8,192-token chain of the bundled novels at 4.8 bits/token: its own exact samples
    score at their floor, from the sparse reference."""
    from cdlm.evaluation.world_score import score_samples
    from cdlm.worlds.reference import ChainReference

    world = worlds.load("world:tokens")
    assert world.vocab_size == 8192 and world.entropy_rate() / math.log(2) == pytest.approx(
        4.81, abs=0.01
    )
    assert isinstance(world.transition_reference(), ChainReference)
    tokens = world.sample(32, 128, generator=torch.Generator().manual_seed(0))
    scores = score_samples(world, tokens, floor_repeats=2)
    assert scores["violation_rate"] == 0.0 and math.isfinite(scores["kl_rate"])
    assert abs(scores["nll_truth"] - scores["entropy_rate"]) < 4 * scores["nll_truth_se"]


@pytest.mark.slow
def test_the_smaller_and_the_low_entropy_token_worlds_are_what_the_docs_say():
    """docs/worlds.md: tokens2k at 4.87 bits/token; tokens2k_top3 at 1.49 and tokens2k_sharp
    at 1.61 (1-2 bits: real text under a strong LM), all over the corpus's 2,048-token BPE."""
    small, low = worlds.load("world:tokens2k"), worlds.load("world:tokens2k_top3")
    sharp = worlds.load("world:tokens2k_sharp")
    assert small.vocab_size == low.vocab_size == sharp.vocab_size == 2048
    assert small.name == "tokens2k" and sharp.options == {}
    assert small.entropy_rate() / math.log(2) == pytest.approx(4.871, abs=0.001)
    assert low.entropy_rate() / math.log(2) == pytest.approx(1.490, abs=0.001)
    assert sharp.entropy_rate() / math.log(2) == pytest.approx(1.613, abs=0.001)
    assert low.step(1).index.shape[1] == 3
