"""The GPU decode check of issue 51, item 4: AR decoding with the growing KV cache, the
fixed-shape step (``sampler.fixed_shape``) and that step replayed from a CUDA graph
(``sampler.graph``), and block decoding, at batch 1 and 16; the block batch-1 row is repeated
before and after the AR rows, to see whether the H200 outlier (5.9 against 228-237 tokens/s in
two runs, docs/results/gpu.md) recurs, and its slowest run is profiled.

    python scripts/gpu_decode.py --out decode.json [--ar RUN --block RUN]

Models: the given run folders (``scripts/gpu_check.sh`` trains them: the quickstart recipe,
bf16-mixed, as in the outlier's run), and always random networks of the quickstart's shape with
an 8,192-token vocabulary (``decode_overhead.py``) as a control. Each row: a warm-up run, then
``--repeats`` timed runs (``cdlm.evaluation.speed.measure``, CUDA synchronised around each),
whole canvases of ``--seq-len`` tokens. The graph and fixed rows' tokens are compared with the
growing cache's at the same seed. Without CUDA the graph rows are skipped, saying so. Writes one
JSON: ``meta``, ``rows``, ``block_batch1`` (every repeat), ``profiles``, ``same_tokens``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

import torch
from decode_overhead import Ids, Shape, network_for, process_of

from cdlm.evaluation.speed import measure
from cdlm.generation import Plan, named_sampler
from cdlm.model_file import Model, load_model

AR_ROWS = (
    ("AR, growing cache", {}),
    ("AR, fixed shape", {"fixed_shape": True}),
    ("AR, CUDA graph", {"graph": True}),
)
SLOW = 0.25  # a block batch-1 run below this share of the median of all of them is an outlier


def models(args: argparse.Namespace, device: str) -> dict[str, Model]:
    """{"<kind> (trained)" or "<kind> (random)": model} for the AR and block processes."""
    shape = Shape(seq_len=args.seq_len)
    found = {}
    for kind, run in (("autoregressive", args.ar), ("block", args.block)):
        if run:
            found[f"{kind} (trained)"] = load_model(run, device)
        process = process_of(kind, shape)
        found[f"{kind} (random)"] = Model(
            process, network_for(process, shape).to(device), Ids(), {}
        )
    return found


def timed(model: Model, sampler: str, options: dict, batch: int, args) -> dict:
    plan = Plan(num_samples=batch, seq_len=args.seq_len, steps=args.seq_len, seed=0)
    sampler_fn = named_sampler(sampler, **options, stop_at_eos=False)
    with torch.no_grad():
        measured = measure(model, sampler_fn, plan, args.repeats)
    runs = measured.runs
    return {
        "batch": batch,
        "tokens_per_sec": [r.tokens_per_sec for r in runs],
        "seconds": [r.wall_seconds for r in runs],
        "warmup_seconds": measured.warmup.wall_seconds,
        "nfe": runs[0].nfe,
        "peak_memory_mb": measured.memory.peak_mb,
        "tokens": [s.token_ids for s in measured.generation.samples],
    }


def profile(model: Model, batch: int, args) -> dict:
    """One block run under torch.profiler: the top ops by self CPU and by self CUDA time, the
    kernel count, and what else holds the GPU (nvidia-smi)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    plan = Plan(num_samples=batch, seq_len=args.seq_len, steps=args.seq_len, seed=0)
    sampler = named_sampler("block", stop_at_eos=False)
    with profiler(activities=activities) as prof, torch.no_grad():
        start = time.perf_counter()
        measure(model, sampler, plan, 1)
        wall = time.perf_counter() - start
    events = prof.key_averages()

    def top(key: str) -> list[dict]:
        ranked = sorted(events, key=lambda e: getattr(e, key, 0), reverse=True)[:12]
        return [{"op": e.key, "us": getattr(e, key, 0), "calls": e.count} for e in ranked]

    apps = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv"],
        capture_output=True, text=True, check=False,
    ) if torch.cuda.is_available() else None  # fmt: skip
    return {
        "wall_seconds_two_runs": wall,
        "by_self_cpu": top("self_cpu_time_total"),
        "by_self_cuda": top("self_device_time_total"),
        "gpu_processes": apps.stdout if apps else "no CUDA",
    }


def block_batch1(block: Model, name: str, when: str, args, rows: list[dict]) -> None:
    for k in range(args.block_repeats):
        row = timed(block, "block", {}, 1, args)
        row.pop("tokens")
        rows.append({"model": name, "when": when, "repeat": k} | row)
        print(f"block b1 {name} {when} #{k}: {fmt(row['tokens_per_sec'])} tok/s", flush=True)


def fmt(values: list[float]) -> str:
    return " / ".join(f"{v:.1f}" for v in (min(values), statistics.median(values), max(values)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--ar", help="a trained autoregressive run folder")
    parser.add_argument("--block", help="a trained block-diffusion run folder")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--block-repeats", type=int, default=3)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    found = models(args, device)
    blocks = {n: m for n, m in found.items() if n.startswith("block")}
    ars = {n: m for n, m in found.items() if n.startswith("autoregressive")}
    rows, repeats, same = [], [], {}
    meta = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "models": {"ar": args.ar, "block": args.block, "random": "decode_overhead.Shape"},
        "seq_len": args.seq_len,
        "repeats": args.repeats,
    }
    result = {"meta": meta, "rows": rows, "block_batch1": repeats, "same_tokens": same}
    save = lambda: write(args.out, result)  # noqa: E731  (after every row: a timeout keeps them)
    for name, model in blocks.items():  # the outlier's run timed AR first: here block first too
        block_batch1(model, name, "before AR", args, repeats)
        save()
    for name, model in ars.items():
        for batch in args.batches:
            tokens = {}
            for label, options in AR_ROWS:
                if options.get("graph") and not cuda:
                    rows.append({"row": label, "model": name, "batch": batch, "skipped": "no CUDA"})
                    continue
                row = timed(model, "ar", options, batch, args)
                tokens[label] = row.pop("tokens")
                rows.append({"row": label, "model": name, "device": device} | row)
                print(f"{label} {name} b{batch}: {fmt(row['tokens_per_sec'])} tok/s", flush=True)
                save()
            growing = tokens["AR, growing cache"]
            same[f"{name} b{batch}"] = {k: v == growing for k, v in tokens.items()}
    for name, model in blocks.items():
        for batch in args.batches:
            row = timed(model, "block", {}, batch, args)
            row.pop("tokens")
            rows.append({"row": "block, KV cache", "model": name, "device": device} | row)
            save()
        block_batch1(model, name, "after AR", args, repeats)
        save()
    speeds = [v for r in repeats for v in r["tokens_per_sec"]]
    slowest = min(repeats, key=lambda r: min(r["tokens_per_sec"]))
    recurred = min(speeds) < SLOW * statistics.median(speeds)
    meta["outlier"] = {"recurred": recurred, "threshold": f"a run below {SLOW} x the median"}
    profiles = [{"model": slowest["model"], "when": "after all rows, the slowest repeat's model"}]
    result["profiles"] = profiles
    profiles[0] |= profile(blocks[slowest["model"]], 1, args)
    save()
    print(f"block batch-1 outlier recurred: {recurred}; wrote {args.out}")


def write(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
