"""The evaluation harness end to end on tiny checkpoints (scorer: a uniform LM stand-in)."""

import json
import statistics

import pytest
import torch
from test_quality import CharTokenizer, UniformLM

from cdlm.evaluation.bound import val_bits_per_token
from cdlm.evaluation.harness import evaluate_checkpoint
from cdlm.evaluation.quality import Scorer
from cdlm.evaluation.report import compare_markdown, summary_markdown
from cdlm.evaluation.speed import spread
from cdlm.generation import named_sampler
from cdlm.likelihood.evaluate import validation_tokens
from cdlm.model_file import load_model
from cdlm.rng import member_seed


@pytest.fixture(scope="module")
def scorer():
    return Scorer(UniformLM(50), CharTokenizer(), "uniform-50")


@pytest.mark.parametrize(
    "ckpt", ["tiny_checkpoint", "tiny_masked_checkpoint", "tiny_ar_checkpoint"]
)
def test_report_is_complete_and_consistent(ckpt, request, scorer, tmp_path):
    path = request.getfixturevalue(ckpt)
    corpus = request.getfixturevalue("tiny_corpus")
    # whole canvases, so that every sample has tokens to score (AR: filled past its EOS)
    sampler = named_sampler("ar", stop_at_eos=False) if ckpt == "tiny_ar_checkpoint" else None
    report = evaluate_checkpoint(
        str(path),
        sampler,
        cut_at_eos=False,
        steps=4,
        num_samples=3,
        seed=0,
        repeats=2,
        grid="uniform",
        scorer=scorer,
        device=torch.device("cpu"),
        data_path=str(corpus),
        likelihood_sequences=4,
    )
    steady = report["speed"]["steady"]
    assert len(report["speed"]["runs"]) == 2
    for key in ("wall_seconds", "tokens_per_sec", "nfe", "positions"):
        assert steady[key]["min"] <= steady[key]["median"] <= steady[key]["max"]
    q = report["quality"]
    assert q["samples"]["scored_tokens"] > 0 and q["reference"]["scored_tokens"] > 0
    assert q["samples"]["gen_ppl"] == pytest.approx(50.0)
    assert q["reference"]["gen_ppl"] == pytest.approx(50.0)
    assert report["likelihood"]["bits_per_token"] > 0
    kind = report["model"]["process"]
    if kind == "gaussian":
        assert steady["revision_rounds"] is None and steady["nfe"]["median"] == 4
    else:  # token-state samplers count revisions and the first settled token
        assert 1 <= steady["revision_rounds"]["max"] <= max(steady["nfe"]["max"], 16)
        first, wall = steady["first_stable_seconds"], steady["wall_seconds"]
        assert 0 < first["min"] <= first["max"] <= wall["max"]  # within the run it settles in
    if kind == "autoregressive":
        assert steady["positions"]["median"] == steady["nfe"]["median"]
        assert report["likelihood"]["kind"] == "exact NLL"
    text = summary_markdown(report)
    assert "real val text" in text and "gen. perplexity (uniform-50)" in text
    out = tmp_path / f"{kind}.json"
    out.write_text(json.dumps(report))
    assert kind in compare_markdown([out, out])


def test_spread_keeps_every_run():
    assert spread([3, 1, 2]) == {"min": 1, "median": 2, "max": 3}
    assert spread([None, None]) is None


@pytest.mark.parametrize("ckpt", ["tiny_checkpoint", "tiny_masked_checkpoint"])
def test_bound_averages_noise_draws_with_their_standard_error(ckpt, request):
    model = load_model(str(request.getfixturevalue(ckpt)))
    tokens = validation_tokens(model, str(request.getfixturevalue("tiny_corpus")))[:4]
    seeds = [member_seed(3, d) for d in range(3)]  # draw d's seed; the first is 3 itself
    single = [val_bits_per_token(model, tokens, seed)["bits_per_token"] for seed in seeds]
    assert len(set(single)) == 3  # each draw is its own Monte Carlo estimate
    averaged = val_bits_per_token(model, tokens, 3, draws=3)
    assert averaged["per_draw"] == pytest.approx(single, rel=1e-6)
    neighbour = val_bits_per_token(model, tokens, 4, draws=3)["per_draw"]
    assert not set(neighbour) & set(averaged["per_draw"])  # seeds 3 and 4 share no draw
    assert averaged["bits_per_token"] == pytest.approx(statistics.mean(single), rel=1e-6)
    assert averaged["std_error"] == pytest.approx(statistics.stdev(single) / 3**0.5, rel=1e-5)
    with pytest.raises(ValueError, match="draws"):
        val_bits_per_token(model, tokens, 3, draws=0)


def test_exact_nll_takes_one_pass_whatever_the_draws(tiny_ar_checkpoint, tiny_corpus):
    model = load_model(str(tiny_ar_checkpoint))
    tokens = validation_tokens(model, str(tiny_corpus))[:4]
    result = val_bits_per_token(model, tokens, 0, draws=4)
    assert result["draws"] == 1 and "std_error" not in result
    assert result["bits_per_token"] == val_bits_per_token(model, tokens, 9)["bits_per_token"]


def test_a_prompted_run_counts_only_the_tokens_it_generated(tiny_masked_checkpoint):
    """tokens/s counts what the sampler wrote: a prompt's fixed positions are not final
    tokens (they made every prompt row of the speed table about 1.25x too fast)."""
    from cdlm.evaluation.speed import timed_run
    from cdlm.generation import Plan
    from cdlm.generation.inputs import read_layout

    model = load_model(str(tiny_masked_checkpoint))
    layout = read_layout(model, 16, prompt="the cat")  # its continuation fills the canvas
    editable = sum(layout.editable)
    assert len(layout.ids) == 16 and 0 < editable < 16
    sampler = named_sampler("confidence", block_length=4, stop_at_eos=False)
    for cut in (False, True):
        plan = Plan(3, len(layout.ids), steps=4, layout=layout, cut_at_eos=cut)
        gen, stats = timed_run(model, sampler, plan)
        assert stats.final_tokens <= 3 * editable
        if not cut:  # whole canvases: exactly the editable positions of every sample
            assert stats.final_tokens == 3 * editable
            assert all(len(s.token_ids) == len(layout.ids) for s in gen.samples)
        assert stats.tokens_per_sec == stats.final_tokens / stats.wall_seconds
    unprompted = Plan(3, 16, steps=4, cut_at_eos=False)
    assert timed_run(model, sampler, unprompted)[1].final_tokens == 3 * 16
