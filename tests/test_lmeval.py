"""lm-evaluation-harness on cdlm models (cdlm/evaluation/lmeval.py, lmeval_scores.py): exact
answers on oracle worlds, the Monte Carlo bound against the exact log-likelihood, local tasks
through ``lm_eval.simple_evaluate`` and the ``cdlm-lm-eval`` command, all offline."""

from __future__ import annotations

import gzip
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval")

import lm_eval  # noqa: E402
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402
from test_worlds import process_cfg, tiny_world  # noqa: E402

from cdlm.evaluation.lmeval import CdlmLM  # noqa: E402
from cdlm.evaluation.lmeval_scores import (  # noqa: E402
    continuation_score,
    cut_at_stops,
    fit_context,
)
from cdlm.likelihood.elbo import elbo  # noqa: E402
from cdlm.model_file import load_model, oracle_model  # noqa: E402
from cdlm.rng import member_seed  # noqa: E402
from cdlm.samplers.base import sampler_name  # noqa: E402
from cdlm.worlds.base import World  # noqa: E402
from cdlm.worlds.chain import symbol_tokenizer  # noqa: E402
from cdlm.worlds.transition import Transition  # noqa: E402

TASKS = Path(__file__).parent / "data" / "lmeval"
PERSUASION = Path(__file__).parents[1] / "cdlm" / "data" / "austen" / "persuasion.txt.gz"


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """No hub or dataset downloads; lm-eval reads the local tasks from their folder."""
    for key in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(key, "1")
    monkeypatch.chdir(TASKS)


def instance(kind: str, *args) -> Instance:
    return Instance(kind, {}, tuple(args), 0)


def cycle_world(length: int = 8) -> World:
    """a -> b -> c -> a, from a uniform start: every continuation of a prompt is certain."""
    step = torch.tensor([[0.0, 1, 0], [0, 0, 1], [1, 0, 0]], dtype=torch.float64)
    start = torch.full((3,), 1 / 3, dtype=torch.float64)
    return World(
        "cycle",
        symbol_tokenizer(["a", "b", "c"]),
        torch.arange(3) + 3,
        start,
        [Transition(step)],
        length,
    )


def evaluate(lm: CdlmLM, task: str, **options) -> dict:
    manager = TaskManager(include_path=str(TASKS), include_defaults=False)
    return lm_eval.simple_evaluate(
        model=lm, tasks=[task], task_manager=manager, bootstrap_iters=0, **options
    )


def exact_nats(world: World, context: list[int], continuation: list[int]) -> float:
    """-log p(continuation | context) by the world's forward pass, float64."""
    joint = world.log_prob(torch.tensor([context + continuation]))
    head = world.log_prob(torch.tensor([context])) if context else torch.zeros(1)
    return -float(joint - head)


def best_next(world: World, prefix: list[int]) -> int:
    """The most likely next token after ``prefix``, by the world's joint probabilities."""
    symbols = [3, 4, 5]
    joint = [float(world.log_prob(torch.tensor([prefix + [v]]))) for v in symbols]
    return symbols[max(range(3), key=joint.__getitem__)]


def test_ar_oracle_loglikelihood_is_the_exact_conditional_and_greedy_is_the_argmax():
    world = tiny_world(length=6)
    lm = CdlmLM(oracle_model(world, process_cfg("autoregressive")))
    pairs = [("ab", "ca"), ("a", "b"), ("cab", "bc"), ("b", "aa"), ("ac", "c")]
    got = lm.loglikelihood([instance("loglikelihood", *p) for p in pairs])
    assert [greedy for _, greedy in got] == [False, False, False, True, True]
    for (context, continuation), (logp, greedy) in zip(pairs, got, strict=True):
        ids = lm.model.tokenizer(context + continuation, add_special_tokens=False)["input_ids"]
        head = len(context)
        assert logp == pytest.approx(-exact_nats(world, ids[:head], ids[head:]), abs=1e-5)
        assert greedy == all(best_next(world, ids[:i]) == ids[i] for i in range(head, len(ids)))
    rolled = lm.loglikelihood_rolling([instance("loglikelihood_rolling", "abcab")])
    ids = lm.model.tokenizer("abcab", add_special_tokens=False)["input_ids"]
    assert rolled[0] == pytest.approx(-exact_nats(world, [], ids), abs=1e-5)
    # longer than seq_len (6): disjoint windows of 6 tokens, each scored on its own
    long = lm.loglikelihood_rolling([instance("loglikelihood_rolling", "abcabcabca")])
    ids = lm.model.tokenizer("abcabcabca", add_special_tokens=False)["input_ids"]
    windows = exact_nats(world, [], ids[:6]) + exact_nats(world, [], ids[6:])
    assert long[0] == pytest.approx(-windows, abs=1e-5)


@pytest.mark.parametrize("context, continuation", [("abc", "a"), ("ab", "ca")])
def test_masked_mc_bound_averages_to_the_exact_conditional(context, continuation):
    """With the exact denoiser the masked ELBO is tight (every order's chain rule is exact), so
    the draw-averaged estimate approaches -log p(continuation | context) itself; the same seed
    gives the same estimate, and more draws a smaller spread between seeds."""
    world = tiny_world(length=6)
    model = oracle_model(world, process_cfg("masked"))
    head = model.tokenizer(context, add_special_tokens=False)["input_ids"]
    tail = model.tokenizer(continuation, add_special_tokens=False)["input_ids"]
    exact = exact_nats(world, head, tail)
    many = continuation_score(model, head, tail, draws=20_000, seed=0, batch_size=20_000)
    assert many.nats == pytest.approx(exact, abs=0.06)
    again = continuation_score(model, head, tail, draws=8, seed=3)
    assert again == continuation_score(model, head, tail, draws=8, seed=3)

    def spread(draws: int) -> float:
        runs = [continuation_score(model, head, tail, draws=draws, seed=s).nats for s in range(40)]
        mean = sum(runs) / len(runs)
        return math.sqrt(sum((r - mean) ** 2 for r in runs) / (len(runs) - 1))

    assert spread(256) < spread(4) / 2


def test_masked_greedy_is_the_argmax_of_one_call_from_the_prior():
    """For one continuation token the masked oracle's one call with it masked is the exact
    next-token posterior, so is_greedy says whether the token is its argmax."""
    world = tiny_world(length=6)
    lm = CdlmLM(oracle_model(world, process_cfg("masked")), mc_draws=2)
    pairs = [("b", "a"), ("b", "c"), ("ac", "c"), ("ac", "a")]
    got = lm.loglikelihood([instance("loglikelihood", *p) for p in pairs])
    assert [greedy for _, greedy in got] == [True, False, True, False]


def test_gaussian_bound_is_above_the_exact_conditional_and_leaves_the_context_out():
    """The gaussian VDM ELBO of the continuation with the context held clean: a bound, so its
    mean over draws is not below the exact conditional (beyond its noise), and the context is
    not scored."""
    world = tiny_world(length=4)
    model = oracle_model(world, process_cfg("gaussian", "process.embed_dim=4"))
    head, tail = [3, 4], [5, 3]
    exact = exact_nats(world, head, tail)
    runs = [continuation_score(model, head, tail, draws=64, seed=s).nats for s in range(6)]
    mean = sum(runs) / len(runs)
    se = math.sqrt(sum((r - mean) ** 2 for r in runs) / (len(runs) - 1) / len(runs))
    assert mean > exact - 3 * se
    # the context is not scored: the whole row's bound exceeds it by about the context's nats
    whole = [continuation_score(model, [], head + tail, draws=64, seed=s).nats for s in range(6)]
    assert mean < sum(whole) / len(whole) - exact_nats(world, [], head) / 2


def test_gaussian_elbo_shows_the_held_context_at_level_zero_at_every_call():
    """``elbo(held=...)``: every call of the denoiser sees the held positions at t = 0 (their
    clean embedding up to sigma_0) and the rest at the call's own level."""
    world = tiny_world(length=4)
    model = oracle_model(world, process_cfg("gaussian", "process.embed_dim=4"))
    process, inner = model.process, model.process.make_denoiser(model.network)
    seen = []

    def spy(x_t, t, *args, **kwargs):
        seen.append((x_t, t))
        return inner(x_t, t, *args, **kwargs)

    tokens = torch.tensor([[3, 4, 5, 3]])
    held = torch.tensor([[True, True, False, False]])
    elbo(spy, process, tokens, generator=torch.Generator().manual_seed(0), t_samples=3, held=held)
    e = process.embedding(tokens)
    assert len(seen) == 3
    for x_t, t in seen:
        assert t.shape == (1, 4) and (t[held] == 0).all() and (t[~held] > 0).all()
        assert torch.allclose(
            x_t[held], e[held], atol=5 * float(process.schedule.sigma(t[held])[0])
        )


@pytest.mark.parametrize("process", ["autoregressive", "masked"])
def test_generate_until_continues_the_cycle_and_cuts_at_the_stop(process):
    model = oracle_model(cycle_world(), process_cfg(process))
    out = evaluate(CdlmLM(model, steps=8), "cdlm_cycle_until", log_samples=True)
    assert out["results"]["cdlm_cycle_until"]["exact_match,none"] == 1.0
    texts = [s["resps"][0][0] for s in out["samples"]["cdlm_cycle_until"]]
    assert texts == ["ca", "a", "ca"]


def test_the_context_is_cut_from_the_left_to_fit_seq_len_and_a_long_continuation_refused():
    assert fit_context([1, 2, 3, 4, 5], [6, 7], 10) == [1, 2, 3, 4, 5]
    assert fit_context([1, 2, 3, 4, 5], [6, 7], 4) == [4, 5]
    assert fit_context([], [6, 7], 2) == []
    with pytest.raises(ValueError, match=r"^a continuation of 3 tokens is longer than the mod"):
        fit_context([1], [6, 7, 8], 2)


def test_cut_at_stops_takes_the_earliest_stop():
    assert cut_at_stops("the cat. sat\nhere", ["\n", "."]) == "the cat"
    assert cut_at_stops("no stop", ["\n", ""]) == "no stop"


def test_cloze_rows_are_held_out_persuasion():
    """Every row's sentence lies in the last 2 % of the novel (the held-out end of the
    document), and its answer is the sentence's last word."""
    with gzip.open(PERSUASION, "rt", encoding="utf-8") as f:
        text = f.read()
    tail = " ".join(text[int(len(text) * 0.98) :].split())
    rows = [json.loads(line) for line in (TASKS / "austen_cloze.jsonl").read_text().splitlines()]
    assert len(rows) == 8
    for row in rows:
        answer = row["choices"][row["label"]]
        assert f"{row['context']} {answer}." in tail


@pytest.mark.parametrize(
    "fixture", ["tiny_ar_checkpoint", "tiny_masked_checkpoint", "tiny_checkpoint"]
)
def test_cloze_accuracy_is_the_argmax_of_the_loglikelihoods(fixture, request):
    """lm-eval's acc on the local cloze equals the share of rows whose gold choice has the
    highest log-likelihood of the model's own answers, asked directly."""
    path = request.getfixturevalue(fixture)
    lm = CdlmLM(str(path), mc_draws=4)
    out = evaluate(lm, "cdlm_austen_cloze", log_samples=True)
    acc = out["results"]["cdlm_austen_cloze"]["acc,none"]
    rows = [json.loads(line) for line in (TASKS / "austen_cloze.jsonl").read_text().splitlines()]
    hits = 0
    for row in rows:
        scores = lm.loglikelihood(
            [request_of(row["context"], " " + choice) for choice in row["choices"]]
        )
        logps = [s[0] for s in scores]
        hits += max(range(len(logps)), key=logps.__getitem__) == row["label"]
    assert acc == pytest.approx(hits / len(rows))


def request_of(context: str, continuation: str) -> Instance:
    return instance("loglikelihood", context, continuation)


@pytest.mark.slow  # ~30 s: lm-eval's command line indexes its thousands of built-in tasks
def test_cdlm_lm_eval_command_runs_a_local_task(tiny_ar_checkpoint, tmp_path):
    """``cdlm-lm-eval --model cdlm``: lm-eval's own CLI finds the registered model."""
    env = os.environ | {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "cdlm.cli.lmeval",
            "--model",
            "cdlm",
            "--model_args",
            f"pretrained={tiny_ar_checkpoint},mc_draws=2",
            "--tasks",
            "cdlm_austen_cloze",
            "--include_path",
            str(TASKS),
            "--limit",
            "2",
            "--output_path",
            str(tmp_path / "out"),
        ],
        cwd=TASKS,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "cdlm_austen_cloze" in result.stdout
    assert list((tmp_path / "out").rglob("results_*.json"))


def test_generate_until_through_a_named_sampler_stops_at_the_stop_string(tiny_masked_checkpoint):
    """``sampler=`` and ``steps=`` reach the sampler; the text ends before the first stop."""
    lm = CdlmLM(str(tiny_masked_checkpoint), sampler="confidence", steps=4)
    wanted = instance("generate_until", "Anne was", {"until": ["e"], "max_gen_toks": 12})
    free = instance("generate_until", "Anne was", {"until": [], "max_gen_toks": 12})
    (cut,), (whole,) = lm.generate_until([wanted]), lm.generate_until([free])
    assert "e" not in cut and whole.startswith(cut)
    assert lm.steps == 4 and sampler_name(lm.sampler) == "confidence"


@pytest.mark.parametrize("fixture", ["tiny_ar_checkpoint", "tiny_masked_checkpoint"])
def test_generate_until_batches_prompts_and_each_is_as_if_alone(fixture, request):
    """Prompts of different lengths in one batched call: request r is what it is alone with
    seed ``member_seed(seed, r)`` (``generate_rows``)."""
    path = request.getfixturevalue(fixture)
    contexts = ["Anne", "Captain Wentworth was", "She had"]
    asked = [instance("generate_until", c, {"until": [], "max_gen_toks": 6}) for c in contexts]
    together = CdlmLM(str(path), steps=6, batch_size=3).generate_until(asked)
    for r, one in enumerate(asked):
        alone = CdlmLM(str(path), steps=6, seed=member_seed(0, r)).generate_until([one])
        assert alone == [together[r]]
    assert len(set(together)) > 1


def test_bad_options_are_refused_in_one_line(tiny_ar_checkpoint):
    with pytest.raises(ValueError, match=r"^mc_draws must be >= 1, got 0$"):
        CdlmLM(str(tiny_ar_checkpoint), mc_draws=0)
    lm = CdlmLM(load_model(tiny_ar_checkpoint))
    bad = instance("generate_until", "Anne", {"until": ["."], "beams": 2})
    with pytest.raises(ValueError, match=r"^unknown gen_kwargs for model=cdlm: beams;"):
        lm.generate_until([bad])
