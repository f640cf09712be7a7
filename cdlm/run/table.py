"""One table of the jobs under some folders (``cdlm-table``): every ``cdlm-train`` and
``cdlm-eval`` job a multirun made, a row each with its overrides, metrics, steps, cost and
commit (``cdlm.run.record``), whichever logger it wrote (``cdlm.run.logs``).

A training job is a folder with Hydra's ``.hydra/overrides.yaml``; its metrics are the last
logged values and the model card's final bound. An evaluation job is a folder with a
``run.json`` of ``cdlm-eval`` (written in a multirun); its metrics are every number of its JSON
reports, flattened to ``path/to/value``. A job that never finished has status ``unfinished``.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path

from omegaconf import OmegaConf

from cdlm.io import atomic_write_text
from cdlm.run import logs, record

# The training metrics a markdown table shows unless asked for others (JSON keeps them all).
SHOWN = (
    "val/loss",
    "val/bits_per_token",
    "val/excess_bits",
    "val/excess_se",
    "final/bits_per_token",
)


def parse_overrides(overrides: list[str]) -> dict[str, str]:
    """``key -> value`` of Hydra override strings (``+``/``~`` prefixes dropped; the escapes
    Hydra writes into a sweep job's values, ``world\\:chars``, undone)."""
    pairs = (str(o).split("=", 1) for o in overrides)
    return {p[0].lstrip("+~"): re.sub(r"\\(.)", r"\1", p[1]) if len(p) > 1 else "" for p in pairs}


def flatten(value: object, prefix: str = "") -> dict[str, float]:
    """Every number in a JSON value, keyed by its path (lists by index)."""
    if isinstance(value, bool):
        return {}
    if isinstance(value, int | float):
        return {prefix: float(value)}
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    out: dict[str, float] = {}
    for key, inner in items:
        out |= flatten(inner, f"{prefix}/{key}" if prefix else str(key))
    return out


def training_job(folder: Path) -> dict:
    """A ``cdlm-train`` job's row (module docstring)."""
    done = record.read(folder)
    overrides = (
        done.overrides if done else list(OmegaConf.load(folder / ".hydra" / "overrides.yaml"))
    )
    metrics = logs.last_values(logs.rows(folder))
    metrics.pop(logs.STEP, None)
    card = folder / "config.json"
    final = (
        json.loads(card.read_text()).get("card", {}).get("metrics", {}) if card.is_file() else {}
    )
    if "bits_per_token" in final:
        metrics["final/bits_per_token"] = float(final["bits_per_token"])
    return job_row("cdlm-train", folder, overrides, done, metrics)


def eval_job(folder: Path, done: record.Record) -> dict:
    """A ``cdlm-eval`` job's row: its reports' numbers."""
    metrics: dict[str, float] = {}
    for path in sorted(folder.glob("*.json")):
        if path.name != record.RECORD:
            metrics |= flatten(json.loads(path.read_text()))
    return job_row("cdlm-eval", folder, done.overrides, done, metrics)


def job_row(command: str, folder: Path, overrides: list[str], done, metrics: dict) -> dict:
    cost = asdict(done.cost) if done else None
    return {
        "job": str(folder),
        "command": command,
        "overrides": parse_overrides(overrides),
        "status": "finished" if done else "unfinished",
        "steps": record.steps(folder) if command == "cdlm-train" else None,
        "cost": cost,
        "commit": done.commit if done else None,
        "metrics": metrics,
    }


def jobs(root: Path) -> list[dict]:
    """Every job under ``root``, in job order (job 2 before job 10)."""
    found: dict[Path, dict] = {}
    for path in root.glob("**/.hydra/overrides.yaml"):
        found[path.parent.parent] = {}
    for path in root.glob(f"**/{record.RECORD}"):
        found.setdefault(path.parent, {})
    rows = []
    for folder in sorted(found, key=lambda p: [s.zfill(12) for s in p.relative_to(root).parts]):
        done = record.read(folder)
        if done is not None and done.command == "cdlm-eval":
            rows.append(eval_job(folder, done))
        else:
            rows.append(training_job(folder))
        rows[-1]["job"] = str(folder.relative_to(root)) or "."
    return rows


def collect(roots: list[Path]) -> dict:
    """The table of every job under ``roots``: ``rows``, and ``shared``, the overrides every job
    has alike (the varying ones are each row's ``varying``)."""
    rows = []
    for root in roots:
        found = jobs(root)
        for row in found:
            row["job"] = str(root / row["job"]) if len(roots) > 1 else row["job"]
        rows += found
    if not rows:
        raise FileNotFoundError(
            f"no jobs (.hydra/overrides.yaml or run.json) under {', '.join(map(str, roots))}"
        )
    keys = list(dict.fromkeys(k for r in rows for k in r["overrides"]))
    varying = [k for k in keys if len({r["overrides"].get(k) for r in rows}) > 1]
    shared = {k: rows[0]["overrides"][k] for k in keys if k not in varying}
    for row in rows:
        row["varying"] = {k: row["overrides"].get(k, "") for k in varying}
    return {"shared": shared, "varying": varying, "rows": rows}


def markdown(table: dict, metrics: list[str] | None = None) -> str:
    """The table as markdown: a column per varying override, steps, the chosen metrics (default:
    ``SHOWN`` where logged), CPU seconds, parallel jobs and commit."""
    rows = table["rows"]
    logged = {k for r in rows for k in r["metrics"]}
    chosen = metrics if metrics else [m for m in SHOWN if m in logged]

    def cell(value: object) -> str:
        if value is None:
            return "-"
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    columns = ["job", *table["varying"], "status", "steps", *chosen, "cpu s", "jobs", "commit"]
    lines = [
        "Every job: "
        + (" ".join(f"`{k}={v}`" for k, v in table["shared"].items()) or "(no overrides)"),
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
    ]
    for r in rows:
        cost = r["cost"] or {}
        cells = [
            r["job"],
            *(r["varying"][k] for k in table["varying"]),
            r["status"],
            r["steps"],
            *(r["metrics"].get(m) for m in chosen),
            cost.get("cpu_seconds"),
            cost.get("parallel_jobs"),
            (r["commit"] or "")[:10] or None,
        ]
        lines.append("| " + " | ".join(cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def write(table: dict, prefix: Path, metrics: list[str] | None = None) -> str:
    """Writes ``PREFIX.json`` (every row, every metric) and ``PREFIX.md`` atomically; returns
    the markdown."""
    text = markdown(table, metrics)
    atomic_write_text(prefix.with_name(prefix.name + ".json"), json.dumps(table, indent=2) + "\n")
    atomic_write_text(prefix.with_name(prefix.name + ".md"), text)
    return text
