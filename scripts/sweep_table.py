"""One table of a ``cdlm-train -m`` multirun: a row per job with the overrides that vary between
jobs, its steps, its last logged ``val/loss`` and ``val/bits_per_token`` (the CSV logger's
``metrics.csv``) and its final bits/token bound (the model card in ``config.json``, measured the
same way for every process). Jobs without a model card are listed as unfinished.

    python scripts/sweep_table.py multirun/sweep_quickstart/2025-01-01_12-00-00

writes ``sweep_table.md`` and ``sweep_table.csv`` into that folder (atomically) and prints the
markdown (docs/guide/sweeps.md).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
from pathlib import Path

from omegaconf import OmegaConf

from cdlm.io import atomic_write_text

LOGGED = ("val/loss", "val/bits_per_token")


def overrides(job: Path) -> dict[str, str]:
    """The job's command-line and sweep overrides, ``key -> value`` (``.hydra/overrides.yaml``)."""
    pairs = (str(o).split("=", 1) for o in OmegaConf.load(job / ".hydra" / "overrides.yaml"))
    return {p[0].lstrip("+~"): p[1] if len(p) > 1 else "" for p in pairs}


def last_logged(job: Path) -> dict[str, float]:
    """Each metric's last value in the job's ``metrics.csv`` files (later versions: resumed)."""
    found: dict[str, float] = {}
    files = sorted(job.glob("csv/version_*/metrics.csv"), key=lambda p: int(p.parent.name[8:]))
    for path in files:
        with path.open(newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                found |= {k: float(v) for k, v in row.items() if v not in ("", None)}
    return found


def job_row(job: Path) -> dict[str, object]:
    """Steps, logged metrics and the final bound of one job; None where the job has none."""
    logged = last_logged(job)
    card_path = job / "config.json"
    card = json.loads(card_path.read_text())["card"] if card_path.is_file() else {}
    steps = card.get("training", {}).get("steps", logged.get("step"))
    return {
        "steps": int(steps) if steps is not None else None,
        **{name: logged.get(name) for name in LOGGED},
        "final bits/token": card.get("metrics", {}).get("bits_per_token"),
        "status": "done" if card else "unfinished",
    }


def table(root: Path) -> tuple[list[str], list[dict[str, object]], dict[str, str]]:
    """(columns, rows, overrides shared by every job) of the multirun folder ``root``."""
    jobs = sorted(
        (p.parent.parent for p in root.glob("**/.hydra/overrides.yaml")),
        key=lambda p: [part.zfill(12) for part in p.relative_to(root).parts],  # job 2 < job 10
    )
    if not jobs:
        raise SystemExit(f"sweep_table.py: no jobs (.hydra/overrides.yaml) under {root}")
    chosen = [overrides(job) for job in jobs]
    keys = list(dict.fromkeys(k for c in chosen for k in c))
    varying = [k for k in keys if len({c.get(k) for c in chosen}) > 1]
    shared = {k: chosen[0][k] for k in keys if k not in varying}
    rows = [
        {"job": str(job.relative_to(root))} | {k: c.get(k, "") for k in varying} | job_row(job)
        for job, c in zip(jobs, chosen, strict=True)
    ]
    return list(rows[0]), rows, shared


def markdown(columns: list[str], rows: list[dict[str, object]], shared: dict[str, str]) -> str:
    def cell(value: object) -> str:
        if value is None:
            return "-"
        return f"{value:.4f}" if isinstance(value, float) else str(value)

    lines = [
        "Every job: " + (" ".join(f"`{k}={v}`" for k, v in shared.items()) or "(no overrides)"),
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
        *("| " + " | ".join(cell(r[c]) for c in columns) + " |" for r in rows),
    ]
    return "\n".join(lines) + "\n"


def csv_text(columns: list[str], rows: list[dict[str, object]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows({c: "" if r[c] is None else r[c] for c in columns} for r in rows)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("multirun", type=Path, help="the sweep folder (hydra.sweep.dir)")
    args = parser.parse_args()
    columns, rows, shared = table(args.multirun)
    text = markdown(columns, rows, shared)
    atomic_write_text(args.multirun / "sweep_table.md", text)
    atomic_write_text(args.multirun / "sweep_table.csv", csv_text(columns, rows))
    print(text, end="")


if __name__ == "__main__":
    main()
