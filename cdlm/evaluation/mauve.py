"""``cdlm-eval metric=mauve``: MAUVE (Pillutla et al. 2021) of a model's samples against real
val text cut to the same lengths, per sampling seed, beside the samples' gen-PPL and entropy.

Gen-PPL alone is half a KL: a sampler that collapses onto a few likely phrases lowers it. MAUVE
compares the two distributions both ways (the area under the divergence frontier of their
quantised features), so collapse and nonsense both cost it; MDLM, ReMDM and Duo report it
beside gen-PPL. It is computed by the ``mauve-text`` package (``pip install "cdlm[mauve]"``) on
features this module makes with the scorer's causal LM, so no model is downloaded.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from omegaconf import DictConfig

from cdlm.evaluation.harness import reference_texts, text_quality
from cdlm.evaluation.metric import Loaded, Measured, draw, scorer_of
from cdlm.evaluation.quality import Scorer, padded
from cdlm.evaluation.world_score import world_spec
from cdlm.generation import Sample, check_whole_canvases
from cdlm.likelihood.evaluate import validation_tokens
from cdlm.rng import member_seed

FEATURES = "final-layer hidden state of each text's last token"
NOISE = (
    "MAUVE is noisy below a few hundred samples per set (Pillutla et al. use 5,000): read a "
    "difference smaller than the spread over seeds as noise"
)


@torch.no_grad()
def features(texts: list[str], scorer: Scorer, batch_size: int = 8) -> np.ndarray:
    """(N, d) float32 features: the scorer's final-layer hidden state at each text's last token
    (the scorer's tokenizer, its own special tokens included).

    The last token, not the mean over tokens: it is how mauve-text featurises text itself (with
    GPT-2 large by default, as in the paper), and in a causal LM it is the one position that has
    read the whole text, where a mean would weigh in early states that have read almost nothing. An empty text is the tokenizer's EOS alone: an empty sample is a sample, and
    dropping it would flatter the model."""
    device = next(scorer.model.parameters()).device
    encoded = [scorer.tokenizer(t)["input_ids"] or [scorer.tokenizer.eos_token_id] for t in texts]
    out = []
    for start in range(0, len(encoded), batch_size):
        chunk = encoded[start : start + batch_size]
        ids, valid = padded(chunk, device)
        hidden = scorer.model(
            input_ids=ids, attention_mask=valid.long(), output_hidden_states=True
        ).hidden_states[-1]
        last = torch.tensor([len(seq) - 1 for seq in chunk], device=device)
        out.append(hidden[torch.arange(len(chunk), device=device), last].float().cpu())
    return torch.cat(out).numpy()


def mauve_package() -> Callable:
    """mauve-text's ``compute_mauve``; a one-line error naming the extra when it is missing."""
    try:
        from mauve import compute_mauve
    except ImportError:
        raise ValueError('metric=mauve needs mauve-text: pip install "cdlm[mauve]"') from None
    return compute_mauve


@dataclass(frozen=True)
class Mauve:
    """A MAUVE value in (0, 1] (1: the sets are quantised alike) and the k-means buckets used."""

    value: float
    buckets: int


def mauve_score(
    p: np.ndarray, q: np.ndarray, num_buckets: int | str = "auto", seed: int = 25
) -> Mauve:
    """MAUVE of feature sets p (N, d) and q (M, d), by mauve-text on the CPU
    (``device_id=-1``; features given, so nothing loads): l2-normalised, PCA to 90% of the
    variance, k-means into ``num_buckets`` clusters (k-means seeded by ``seed``), then the area
    under the divergence frontier of the two histograms with scaling c = 5.

    ``auto`` is mauve-text's min(N, M) / 10, at least 2: about ten points a cluster, what the
    authors recommend. More buckets than that on a small set leaves most of them holding a point
    or two of one set only, and MAUVE falls for sets drawn from one distribution."""
    out = mauve_package()(
        p_features=p, q_features=q, num_buckets=num_buckets, device_id=-1, verbose=False, seed=seed
    )
    return Mauve(float(out.mauve), int(out.num_buckets))


def mauve(loaded: Loaded, cfg: DictConfig, seeds: int, num_buckets: int | str = "auto") -> Measured:
    """``metric=mauve``: for each of ``seeds`` seeds (``member_seed(seed, k)``: ``seed``, then
    seeds no other base seed's run shares),
    ``num_samples`` samples with the chosen sampler and steps (cut at EOS as ``cut_at_eos``
    says) against as many val sequences cut to their lengths, MAUVE on the scorer's ``features``
    (``mauve_score``), beside both sets' gen-PPL and entropy. Refused for a model of an exact
    world (``scorer=world`` scores it exactly) and without a scorer to make features."""
    mauve_package()  # a missing package fails before anything is sampled
    model = loaded.model
    if model.config.get("world") or world_spec(str(cfg.scorer), model.config):
        raise ValueError(
            "metric=mauve compares text with real text under a language model; a model of an "
            "exact world is scored by the world itself: metric=report scorer=world"
        )
    if cfg.scorer == "none":
        raise ValueError("metric=mauve makes its features with the scorer; give one, not none")
    check_whole_canvases(loaded.choice.sampler, cfg.cut_at_eos, model.process.block_size)
    val = validation_tokens(model, cfg.data.path, cfg.data.val_fraction, cfg.data.packing)
    if len(val) < cfg.num_samples:
        raise ValueError(
            f"metric=mauve compares {cfg.num_samples} samples with as many val sequences, and the "
            f"val split holds {len(val)}: lower num_samples or give more data (data.path)"
        )
    scorer = scorer_of(str(cfg.scorer), loaded.device)
    rows = []
    for seed in (member_seed(cfg.seed, k) for k in range(seeds)):
        samples = draw(loaded, cfg, seed)
        real = reference_texts(model, val, samples)
        kmeans = seed % 2**32  # scikit-learn's seeds are 32-bit
        rows.append({"seed": seed} | _compare(samples, real, scorer, num_buckets, kmeans))
    values = [r["mauve"] for r in rows]
    spread = {
        "mean": statistics.fmean(values),
        "min": min(values),
        "median": statistics.median(values),
        "max": max(values),
    }
    result = {
        "metric": "mauve",
        "ckpt": loaded.ckpt,
        "scorer": scorer.name,
        "features": FEATURES,
        "sampler": {
            "name": loaded.choice.name,
            "options": loaded.choice.options,
            "steps": loaded.choice.steps,
            "grid": cfg.grid,
            "temperature": cfg.temperature,
        },
        "num_samples": cfg.num_samples,
        "cut_at_eos": cfg.cut_at_eos,
        "mauve": spread | {"per_seed": values},
        "seeds": rows,
        "caveat": NOISE,
    }
    return Measured("mauve", result, _summary(result))


def _compare(
    samples: list[Sample], real: list[Sample], scorer: Scorer, buckets: int | str, seed: int
) -> dict:
    """One seed's MAUVE (its k-means seeded by the sampling seed too, so that the spread over
    seeds holds the clustering's noise as well as the sampling's) and both sets' quality."""
    p = features([s.text for s in samples], scorer)
    score = mauve_score(p, features([r.text for r in real], scorer), buckets, seed)
    return {
        "mauve": score.value,
        "num_buckets": score.buckets,
        "samples": text_quality([s.token_ids for s in samples], [s.text for s in samples], scorer),
        "reference": text_quality([r.token_ids for r in real], [r.text for r in real], scorer),
    }


def _summary(result: dict) -> str:
    m, rows = result["mauve"], result["seeds"]
    per_seed = ", ".join(f"seed {r['seed']}: {r['mauve']:.3f}" for r in rows)
    ppl = statistics.fmean(r["samples"]["gen_ppl"] for r in rows)
    real_ppl = statistics.fmean(r["reference"]["gen_ppl"] for r in rows)
    entropy = statistics.fmean(r["samples"]["token_entropy_bits"] for r in rows)
    real_entropy = statistics.fmean(r["reference"]["token_entropy_bits"] for r in rows)
    return (
        f"cdlm-eval: MAUVE of {result['num_samples']} samples against as many real val "
        f"sequences at equal length, {len(rows)} seed(s), features {result['scorer']} "
        f"({FEATURES}), {rows[0]['num_buckets']} buckets: mean {m['mean']:.3f}, min/median/max "
        f"{m['min']:.3f}/{m['median']:.3f}/{m['max']:.3f} ({per_seed}); gen-PPL {ppl:.1f} "
        f"(real text {real_ppl:.1f}), token entropy {entropy:.2f} bits (real text "
        f"{real_entropy:.2f}), means over seeds. {NOISE}."
    )
