"""Label accuracy and diversity against the classifier-free guidance scale, one run.

    python experiments/guidance_sweep.py outputs/budget/gaussian/model.safetensors \
        outputs/budget/masked/model.safetensors --out docs/guidance_sweep

For each class-conditional checkpoint, each scale and each label (novel): ``--per-label``
samples of whole canvases (EOS written as line breaks) with the process's default sampler. Label
accuracy is the share of samples whose conditioning label a judge recovers. Two judges, both
trained on real text only, never on generated text (``cdlm.evaluation.judge``): multinomial naive
Bayes over words, fitted on the training part of each novel, and each novel's characteristic
proper names (a sample with none of them counts as a miss). Their accuracy on held-out real text
of about the same length is the ceiling; chance is 1 / number of labels. Diversity: token entropy
and distinct-n of all samples at that scale. Writes ``<out>.json`` and ``<out>.png``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from cdlm.checkpoint import load_checkpoint  # noqa: E402
from cdlm.evaluation.judge import (  # noqa: E402
    LabelJudge,
    characteristic_names,
    corpus_chunks,
    name_votes,
)
from cdlm.evaluation.quality import diversity  # noqa: E402
from cdlm.generate import default_sampler, generate  # noqa: E402
from cdlm.guidance import Guidance  # noqa: E402
from cdlm.io import atomic_path, atomic_write_text  # noqa: E402


def judges(window_words: int) -> tuple[LabelJudge, dict[str, list[str]], dict]:
    """Both judges fitted on the training windows, and their accuracy on held-out windows."""
    chunks = corpus_chunks(window_words=window_words)
    judge = LabelJudge().fit(chunks.train_texts, chunks.train_labels)
    by_label: dict[str, list[str]] = {}
    for text, label in zip(chunks.train_texts, chunks.train_labels, strict=True):
        by_label.setdefault(label, []).append(text)
    names = characteristic_names(by_label)
    votes = [name_votes(t, names) for t in chunks.val_texts]
    ceiling = {
        "naive_bayes": judge.accuracy(chunks.val_texts, chunks.val_labels),
        "names": sum(v == y for v, y in zip(votes, chunks.val_labels, strict=True)) / len(votes),
        "window_words": window_words,
        "held_out_windows": len(chunks.val_texts),
    }
    return judge, names, ceiling


def sweep(ckpt: str, scales: list[float], per_label: int, steps: int, judge, names) -> dict:
    model = load_checkpoint(ckpt, torch.device("cpu"))
    labels = model.config["labels"]
    sampler = default_sampler(model.process)
    rows = []
    for w in scales:
        # every label in one batch, ``per_label`` samples each; the same seed at every scale
        truth = [label for label in labels for _ in range(per_label)]
        gen = generate(
            model.process,
            model.network,
            model.tokenizer,
            sampler,
            steps=steps,
            num_samples=len(truth),
            seq_len=model.config["seq_len"],
            seed=0,
            cut_at_eos=False,
            guidance=Guidance(label=[labels.index(y) for y in truth], scale=w),
        )
        texts = [s.text for s in gen.samples]
        tokens = [s.token_ids for s in gen.samples]
        nfe, seconds = gen.nfe, gen.wall_seconds
        predicted = judge.predict(texts)
        votes = [name_votes(t, names) for t in texts]
        rows.append(
            {
                "scale": w,
                "accuracy_naive_bayes": sum(p == y for p, y in zip(predicted, truth, strict=True))
                / len(truth),
                "accuracy_names": sum(v == y for v, y in zip(votes, truth, strict=True))
                / len(truth),
                "nfe": nfe,
                "wall_seconds": seconds,
                **diversity(tokens),
                "examples": {y: t for t, y in list(zip(texts, truth, strict=True))[::per_label]},
            }
        )
        print(
            f"{model.process.kind} w={w:g}: NB acc {rows[-1]['accuracy_naive_bayes']:.3f}, "
            f"names acc {rows[-1]['accuracy_names']:.3f}, "
            f"entropy {rows[-1]['token_entropy_bits']:.2f} bits, "
            f"distinct-2 {rows[-1]['distinct_2']:.3f}, {seconds:.0f}s",
            flush=True,
        )
    return {
        "ckpt": ckpt,
        "process": model.process.kind,
        "sampler": sampler.func.sampler_name,
        "steps": steps,
        "labels": labels,
        "rows": rows,
    }


def plot(results: list[dict], ceiling: dict, path: Path) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    chance = 1 / len(results[0]["labels"])
    for r in results:
        w = [row["scale"] for row in r["rows"]]
        kind = r["process"]
        axes[0].plot(w, [row["accuracy_naive_bayes"] for row in r["rows"]], "o-", label=kind)
        axes[0].plot(w, [row["accuracy_names"] for row in r["rows"]], "x--", label=f"{kind}, names")
        axes[1].plot(w, [row["token_entropy_bits"] for row in r["rows"]], "o-", label=kind)
        axes[2].plot(w, [row["distinct_2"] for row in r["rows"]], "o-", label=kind)
    axes[0].axhline(ceiling["naive_bayes"], color="k", ls=":", label="real text (NB)")
    axes[0].axhline(chance, color="grey", ls=":", label="chance")
    titles = ("label accuracy", "token entropy (bits)", "distinct-2")
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xlabel("guidance scale w")
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("ckpts", nargs="+")
    parser.add_argument("--scales", default="0,1,2,4")
    parser.add_argument("--per-label", type=int, default=8)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--window-words", type=int, default=75)
    parser.add_argument("--out", default="docs/guidance_sweep")
    args = parser.parse_args()
    scales = [float(s) for s in args.scales.split(",")]
    judge, names, ceiling = judges(args.window_words)
    print(f"judges on held-out real text: {ceiling}", flush=True)
    results = [sweep(c, scales, args.per_label, args.steps, judge, names) for c in args.ckpts]
    report = {"ceiling": ceiling, "names": names, "results": results}
    out = Path(args.out)
    atomic_write_text(out.with_suffix(".json"), json.dumps(report, indent=2) + "\n")
    plot(results, ceiling, out.with_suffix(".png"))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
