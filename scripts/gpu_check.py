"""The Python half of scripts/gpu_check.sh: times AR, block and speculative decoding
(``speed``) and writes the one summary table of every step (``summary``; the ``decode`` step's
figures come from scripts/gpu_decode.py's JSON).

    python scripts/gpu_check.py speed --ar RUN --block RUN --out speed.json [--batches 1 16]
    python scripts/gpu_check.py summary OUT

``summary`` reads OUT/steps.tsv (step, exit status or ``skip:<reason>``, wall seconds, one line
a step, written by the shell script) and each step's files in OUT, and writes the table to
stdout, OUT/summary.md and OUT/summary.json.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
from pathlib import Path

ROWS = (("AR, KV cache", "ar", "ar", {}), ("block, KV cache", "block", "block", {}))
SPECULATIVE = ("speculative", "block", "speculative", {})


def spread_text(values: list[float]) -> str:
    """min / median / max, in thousands when large (tokens/s)."""
    if not values:
        return "n/a"
    lo, mid, hi = min(values), statistics.median(values), max(values)
    if mid >= 1000:
        return f"{lo / 1e3:.1f}k / {mid / 1e3:.1f}k / {hi / 1e3:.1f}k"
    return f"{lo:.1f} / {mid:.1f} / {hi:.1f}"


def read_metrics(path: Path) -> dict[str, list[tuple[int, float]]]:
    """A Lightning CSV log as {column: [(step, value), ...]}, empty cells left out."""
    columns: dict[str, list[tuple[int, float]]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            for key, value in row.items():
                if key != "step" and value not in ("", None):
                    columns.setdefault(key, []).append((int(row["step"]), float(value)))
    return columns


def training_figures(out: Path, name: str) -> str:
    """Optimizer steps, logged tokens/s and the last losses of one training run."""
    path = out / f"{name}_metrics.csv"
    if not path.exists():
        return "no metrics.csv"
    metrics = read_metrics(path)
    steps = max((s for rows in metrics.values() for s, _ in rows), default=-1) + 1
    speed = [v for _, v in metrics.get("train/tokens_per_sec", [])]
    parts = [f"{steps} steps (last logged + 1)", f"tokens/s min/med/max {spread_text(speed)}"]
    for key in ("train/loss", "val/loss"):
        if metrics.get(key):
            step, value = metrics[key][-1]
            parts.append(f"{key} {value:.3f} @ {step}")
    return "; ".join(parts)


def speed_figures(out: Path) -> str:
    path = out / "speed.json"
    if not path.exists():
        return "no speed.json"
    rows = json.loads(path.read_text())
    return "; ".join(
        f"{r['name']} b{r['batch']} {r['device']}: {spread_text(r['tokens_per_sec'])} tok/s"
        for r in rows
    )


def decode_figures(out: Path) -> str:
    """The median tokens/s of each row of scripts/gpu_decode.py, the block batch-1 repeats,
    and whether the outlier recurred."""
    path = out / "decode.json"
    if not path.exists():
        return "no decode.json"
    found = json.loads(path.read_text())
    rows = [
        f"{r['row']} {r['model']} b{r['batch']}: "
        + (f"skipped ({r['skipped']})" if "skipped" in r else spread_text(r["tokens_per_sec"]))
        for r in found["rows"]
    ]
    repeats = [statistics.median(r["tokens_per_sec"]) for r in found["block_batch1"]]
    rows.append("block b1 repeats (medians): " + ", ".join(f"{v:.0f}" for v in repeats))
    rows.append(f"outlier recurred: {found['meta']['outlier']['recurred']}")
    return "; ".join(rows)


def log_figures(out: Path, name: str) -> str:
    """The pytest tally, a pip install's last line or a sample's speed line, from the log."""
    path = out / f"{name}.log"
    if not path.exists():
        return ""
    text = path.read_text(errors="replace")
    tally = re.findall(r"^=* ?(\d+ (?:passed|failed|skipped|error).*?) in [\d.]+s", text, re.M)
    if tally:
        return tally[-1]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    said = [line for line in lines if line.startswith(("cdlm ", "cdlm-sample: ", "speed:"))]
    return (said or lines or [""])[-1][:160]


def figures(out: Path, name: str) -> str:
    if name == "speed":
        return speed_figures(out)
    if name == "decode":
        return decode_figures(out)
    if (out / f"{name}_metrics.csv").exists():
        return training_figures(out, name)
    return log_figures(out, name)


def status_of(rc: str, figures: str) -> str:
    """A step's status from its exit status (or ``skip:<reason>``) and its figures: a test
    run whose every test skipped is reported skipped, not ok."""
    if rc == "0" and re.fullmatch(r"\d+ skipped", figures):
        return "skipped (every test: no CUDA device)"
    if rc.startswith("skip"):
        return "skipped (" + rc.partition(":")[2] + ")"
    if rc in ("124", "137"):
        return f"timeout (rc {rc})"
    return "ok" if rc == "0" else f"FAILED (rc {rc})"


def summary(out: Path) -> list[dict[str, str]]:
    """Every step of OUT/steps.tsv with its status, wall seconds and key figures; writes them
    to OUT/summary.md and OUT/summary.json and returns them."""
    rows = []
    for line in (out / "steps.tsv").read_text().splitlines():
        name, rc, seconds = line.split("\t")
        found = figures(out, name)
        rows.append(
            {"step": name, "status": status_of(rc, found), "seconds": seconds, "figures": found}
        )
    table = ["| step | status | wall s | key figures |", "| --- | --- | ---: | --- |"]
    table += [f"| {r['step']} | {r['status']} | {r['seconds']} | {r['figures']} |" for r in rows]
    (out / "summary.md").write_text("\n".join(table) + "\n")
    (out / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
    print("\n".join(table))
    return rows


def time_decoding(args: argparse.Namespace) -> list[dict]:
    """Tokens/s of each decoding row at each batch size: a warm-up, then ``repeats`` timed runs
    (``cdlm.evaluation.speed.measure``: CUDA synchronised around each run), whole canvases."""
    import torch

    from cdlm.evaluation.speed import measure
    from cdlm.generation import Plan, named_sampler
    from cdlm.model_file import load_model

    device = "cuda" if torch.cuda.is_available() else "cpu"
    models = {"ar": load_model(args.ar, device), "block": load_model(args.block, device)}
    results = []
    for name, key, sampler_name, options in (*ROWS, SPECULATIVE):
        model = models[key]
        sampler = named_sampler(sampler_name, **options, stop_at_eos=False)
        for batch in args.batches:
            plan = Plan(num_samples=batch, seq_len=args.seq_len, steps=args.seq_len, seed=0)
            with torch.no_grad():
                measured = measure(model, sampler, plan, args.repeats)
            speeds = [r.tokens_per_sec for r in measured.runs]
            results.append(
                {
                    "name": name,
                    "batch": batch,
                    "device": device,
                    "tokens_per_sec": speeds,
                    "nfe": measured.runs[0].nfe,
                    "peak_memory_mb": measured.memory.peak_mb,
                }
            )
            print(
                f"speed: {name} batch {batch} on {device}: {spread_text(speeds)} tok/s", flush=True
            )
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    speed = commands.add_parser("speed", help="time AR, block and speculative decoding")
    speed.add_argument("--ar", required=True, help="an autoregressive model (run folder)")
    speed.add_argument("--block", required=True, help="a block-diffusion model (run folder)")
    speed.add_argument("--out", required=True, help="the JSON file to write")
    speed.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    speed.add_argument("--seq-len", type=int, default=128)
    speed.add_argument("--repeats", type=int, default=3)
    table = commands.add_parser("summary", help="write the summary table of OUT/steps.tsv")
    table.add_argument("out", type=Path)
    args = parser.parse_args()
    if args.command == "speed":
        time_decoding(args)
    else:
        summary(args.out)


if __name__ == "__main__":
    main()
