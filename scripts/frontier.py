"""Draws the speed/quality frontier: gen-PPL against tokens/s, one point per row, AR and
speculative rows marked, one panel per batch size, from ``experiments/speed.py``'s JSON or any
``cdlm-eval`` reports.

    python scripts/frontier.py docs/results/speed.json my_report.json --out docs/results/speed.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def points(path: Path) -> list[dict]:
    """(name, process, sampler, batch, tokens/s, gen-PPL) rows of a speed report (its
    no-prompt rows, the ones with a gen-PPL) or of a cdlm-eval report."""
    data = json.loads(path.read_text())
    if "rows" in data:  # experiments/speed.py
        return [
            {
                "name": r["name"],
                "process": r["process"],
                "sampler": r["sampler"],
                "batch": r["batch"],
                "tps": r["tokens_per_s_median"],
                "ppl": r["gen_ppl"],
            }
            for r in data["rows"]
            if r.get("gen_ppl")
        ]
    ppl = data["quality"]["samples"].get("gen_ppl")  # a cdlm-eval report
    tps = data["speed"]["steady"]["tokens_per_sec"]["median"]
    name = f"{path.stem} ({data['sampler']['name']}, {data['sampler']['steps']} steps)"
    return (
        [
            {
                "name": name,
                "process": data["model"]["process"],
                "sampler": data["sampler"]["name"],
                "batch": data["batch_size"],
                "tps": tps,
                "ppl": ppl,
            }
        ]
        if ppl
        else []
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("frontier.png"))
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [p for path in args.reports for p in points(path)]
    batches = sorted({r["batch"] for r in rows})
    fig, axes = plt.subplots(1, len(batches), figsize=(6 * len(batches), 4.5), squeeze=False)
    for ax, batch in zip(axes[0], batches, strict=True):
        for r in (r for r in rows if r["batch"] == batch):
            ar = r["process"] == "autoregressive"
            ax.scatter(
                r["tps"],
                r["ppl"],
                marker="*" if ar else "^" if r["sampler"] == "speculative" else "o",
                s=160 if ar else 40,
                color="black" if ar else None,
                zorder=3,
            )
            ax.annotate(
                r["name"],
                (r["tps"], r["ppl"]),
                fontsize=6,
                xytext=(3, 3),
                textcoords="offset points",
            )
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="tokens/s (median)",
            ylabel="gen-PPL",
            title=f"batch {batch} (AR: black star; speculative: triangle)",
        )
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
