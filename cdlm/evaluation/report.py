"""Evaluation reports: one JSON per evaluation, a markdown summary, and a side-by-side table.

Every number in a summary is from the report itself; repeated-run figures are shown as
median [min, max].
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cdlm import hub, worlds

QUALITY_ROWS = (
    ("gen_ppl", "gen. perplexity ({scorer})"),
    ("token_entropy_bits", "token entropy (bits)"),
    ("distinct_2", "distinct-2"),
    ("distinct_3", "distinct-3"),
    ("repetition_4", "repeated 4-grams"),
    ("mean_length", "mean length (tokens)"),
)
# scorer=world (cdlm/evaluation/world_score.py): these rows first, gen-PPL's row left out
WORLD_ROWS = (
    ("nll_truth", "NLL under the world (bits/token, ± s.e.)"),
    ("entropy_rate", "entropy rate (bits/token)"),
    ("kl_rate", "transition KL rate (bits)"),
    ("kl_floor", "its floor: exact samples (± s.e.)"),
    ("tv_rate", "transition TV rate"),
    ("tv_floor", "its floor: exact samples (± s.e.)"),
    ("violation_rate", "impossible samples (share)"),
    ("constraint_rate", "broken constraints (share)"),
)
SPEED_ROWS = (
    ("wall_seconds", "wall time (s)"),
    ("tokens_per_sec", "tokens/s (generated tokens)"),
    ("nfe", "NFE"),
    ("positions", "positions processed / sequence"),
    ("revision_rounds", "revision rounds"),
    ("first_stable_seconds", "first settled token (s)"),
)


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, dict):  # min / median / max
        return f"{_fmt(value['median'])} [{_fmt(value['min'])}, {_fmt(value['max'])}]"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.3e}"
    return str(value)


def _with_error(side: dict, key: str) -> str:
    """A figure, with `± its standard error` where the report has one (``<key>_se``)."""
    error = side.get(f"{key}_se")
    suffix = f" ± {_fmt(error)}" if error is not None and side.get(key) is not None else ""
    return _fmt(side.get(key)) + suffix


def summary_markdown(report: dict) -> str:
    """The report as markdown: setup, quality beside real text, likelihood, speed."""
    m, s = report["model"], report["sampler"]
    env = report["environment"]
    lines = [
        f"# cdlm-eval: {m['process']} model, sampler {s['name']}, {s['steps']} steps",
        "",
        f"- model: `{m['ckpt']}` ({m['parameters'] / 1e6:.2f}M parameters, "
        f"seq_len {m['seq_len']}), tokenizer: {m['tokenizer']}",
        f"- sampler options: {json.dumps(s['options'])}, grid {s['grid']}",
        f"- batch size {report['batch_size']}, seed {report['seed']}, {report['repeats']} timed "
        f"runs after 1 warm-up; torch {env['torch']}, {env['threads']} threads, {env['device']}",
        f"- model load {report['load_seconds']:.2f} s; warm-up run "
        f"{report['speed']['warmup']['wall_seconds']:.2f} s",
        "",
    ]
    q = report["quality"]
    world = "world" in q  # scored by an exact world: its figures, beside exact samples
    rows = WORLD_ROWS + QUALITY_ROWS[1:] if world else QUALITY_ROWS
    beside = f"exact {q['scorer']} samples" if world else "real val text"
    lines += [f"| quality | samples | {beside} |", "|---|---|---|"]
    for key, label in rows:
        label = label.format(scorer=q.get("scorer", "scorer"))
        lines.append(
            f"| {label} | {_with_error(q['samples'], key)} | {_with_error(q['reference'], key)} |"
        )
    lik = report.get("likelihood")
    if lik:
        error = (
            f" ± {lik['std_error']:.4f}, mean of {lik['draws']} draws" if "std_error" in lik else ""
        )
        line = (
            f"Validation {lik['kind']}: **{lik['bits_per_token']:.4f} bits/token** "
            f"({lik['sequences']} sequences{error})."
        )
        if "excess_bits" in lik:  # scorer=world: on exact samples, beside the entropy rate
            line = (
                f"{lik['kind']} on {lik['data']}: **{lik['bits_per_token']:.4f} bits/token**"
                f"{error}; entropy rate {lik['entropy_rate_bits']:.4f} (these sequences' exact "
                f"NLL {lik['exact_nll_bits']:.4f}): excess **{lik['excess_bits']:.4f} bits/token**."
            )
        lines += ["", line]
    lines += ["", "| speed and work (median [min, max]) | value |", "|---|---|"]
    steady = report["speed"]["steady"]
    for key, label in SPEED_ROWS:
        lines.append(f"| {label} | {_fmt(steady.get(key))} |")
    lines.append(f"| peak memory (MB) | {_fmt(report['speed']['peak_memory_mb'])} |")
    return "\n".join(lines) + "\n"


def _flat(report: dict) -> dict[str, Any]:
    row = {
        "process": report["model"]["process"],
        "sampler": report["sampler"]["name"],
        "steps": report["sampler"]["steps"],
        "batch": report["batch_size"],
    }
    for key, _ in QUALITY_ROWS:
        row[key] = report["quality"]["samples"].get(key)
    row["bits_per_token"] = (report.get("likelihood") or {}).get("bits_per_token")
    for key, _ in SPEED_ROWS:
        value = report["speed"]["steady"].get(key)
        row[key] = value["median"] if isinstance(value, dict) else value
    return row


def compare_markdown(paths: list[str | Path]) -> str:
    """Several reports in one table, one column per report (medians for repeated runs)."""
    reports = [json.loads(Path(p).read_text()) for p in paths]
    rows = [_flat(r) for r in reports]
    header = "| | " + " | ".join(Path(p).stem for p in paths) + " |"
    lines = [header, "|---" * (len(paths) + 1) + "|"]
    for key in rows[0]:
        lines.append(f"| {key} | " + " | ".join(_fmt(r[key]) for r in rows) + " |")
    return "\n".join(lines) + "\n"


def log_to_wandb(report: dict) -> None:
    """A full report as a W&B run summary plus a samples table (the W&B mode is the caller's:
    offline without a key)."""
    import wandb  # here: only runs that log to W&B load it

    run = wandb.init(
        project="cdlm",
        job_type="eval",
        config={k: report[k] for k in ("model", "sampler", "batch_size", "seed", "environment")},
    )
    flat = {
        f"quality/{side}/{k}": v
        for side in ("samples", "reference")
        for k, v in report["quality"][side].items()
    }
    flat |= {f"speed/{k}": v["median"] for k, v in report["speed"]["steady"].items() if v}
    flat["val/bits_per_token"] = report["likelihood"]["bits_per_token"]
    run.summary.update(flat)
    run.log({"samples": wandb.Table(columns=["text"], data=[[t] for t in report["samples"]])})
    run.finish()


def default_path(ckpt: str, metric: str, process: str | None = None) -> Path:
    """Where the report of ``metric`` (a ``Measured.name``: ``report``, ``elbo``, ``task_plan``
    ...) goes without ``out=``: beside the model (``eval.json`` in a model folder,
    ``<stem>.eval.json`` beside another file name); for a Hub id, in the current folder; for a
    world's oracle of ``process`` (its ``_target_``), ``world-<name>-<process>.eval.json`` in
    the current folder."""
    name = "eval.json" if metric == "report" else f"eval_{metric}.json"
    if worlds.is_world(ckpt):
        kind = str(process).rsplit(".", 1)[-1].removesuffix("Process").lower()
        return Path(f"{ckpt.replace(':', '-')}-{kind}.{name}")
    if hub.is_hub_id(ckpt):
        return Path(f"{ckpt.replace('/', '--')}.{name}")
    path = Path(ckpt)
    if path.is_dir():
        return path / name
    return path.with_name(name if path.stem == "model" else f"{path.stem}.{name}")
