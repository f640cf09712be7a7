"""What every study shares beyond its configs: its sweep's table (``cdlm-table``'s collector),
curves from the jobs' logs, crossings of a threshold, and the results doc with its generated
header (the command that regenerates it, the commits, the date, the machine, the jobs that
shared it). Studies import this module and the library, never one another
(tests/test_studies.py).

A study is ``conf/experiment/<study>*.yaml`` with its sweep grid (``hydra.sweeper.params``),
trained with ``cdlm-train -m`` and evaluated with ``cdlm-eval -m`` into fixed sweep folders,
then reported by ``python experiments/<study>.py`` from those folders (experiments/README.md).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from omegaconf import OmegaConf

from cdlm.evaluation.world_score import finite_row
from cdlm.io import atomic_write_text
from cdlm.run import logs
from cdlm.run.table import collect

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
END = "<!-- end generated -->"  # a results doc's reading after it survives regeneration
# The samplers every model of a text-and-world study is drawn with (duo, worlds_learned's Austen
# rows), whole canvases at seed 0; the first of each process also gets the temperature frontier.
STEPS = (8, 16, 64, 128)
# process -> [(label, conf/sampler name, options, step counts)]; the first also gets the frontier
# (a uniform step costs ~3x a masked one here: every position draws from V each step)
SAMPLERS = {
    "masked": [("ancestral", "ancestral", {}, STEPS)],
    "uniform": [
        ("duo_ancestral", "duo_ancestral", {}, (4, *STEPS)),  # 4: beside the DCD students
        ("duo_psi", "duo_psi", {}, (8, 64)),
    ],
    "gaussian": [("ddpm", "ddpm", {}, STEPS)],
    "autoregressive": [("ar", "ar", {"stop_at_eos": False}, None)],
}
FRONTIER_STEPS, FRONTIER_T = (8,), (0.8, 0.9)  # Austen only: the world's scorer is the truth


def table(*folders: Path) -> dict:
    """The jobs of the study's sweep folders, as ``cdlm-table`` collects them; each row also
    gets its job's ``folder``."""
    roots = [Path(f) for f in folders]
    found = collect(roots)
    for row in found["rows"]:
        row["folder"] = str(roots[0] / row["job"]) if len(roots) == 1 else row["job"]
    return found


def sweep_command(sweep: Path) -> str:
    """The ``cdlm-train -m`` command that made a sweep folder (Hydra's ``multirun.yaml``), its
    sweep folder named as given (a results header names no machine path)."""
    made = OmegaConf.load(Path(sweep) / "multirun.yaml").hydra.overrides
    named = [f"hydra.sweep.dir={sweep}" if str(o).startswith("hydra.sweep.dir=") else str(o)
             for o in [*made.task, *made.hydra]]  # fmt: skip
    return "cdlm-train -m " + " ".join(named)


def rows(found: dict, status: str = "finished") -> list[dict]:
    """The table's rows with this status."""
    return [r for r in found["rows"] if r["status"] == status]


def job_curve(row: dict, metric: str) -> list[tuple[int, float]]:
    """``(step, value)`` of ``metric`` over a training job (its CSV or W&B log)."""
    return logs.curve(logs.rows(Path(row["folder"])), metric)


def students(folder: Path) -> dict[int, Path]:
    """A distillation job's round students by step count (``rounds/round<k>_<steps>steps
    .safetensors``, the ``module.round_dir`` the study configs set)."""
    found = sorted((folder / "rounds").glob("round*_*steps.safetensors"))
    return {int(p.stem.split("_")[1].removesuffix("steps")): p for p in found}


def crossing(points: Sequence[tuple[float, float]], level: float) -> float | None:
    """The first x at which a falling curve ``[(x, y), ...]`` reaches ``level``: linear between
    the last point above and the first at or below it; None if it never does."""
    previous = None
    for x, y in points:
        if y <= level:
            if previous is None:
                return float(x)
            (x0, y0) = previous
            return float(x0 + (x - x0) * (y0 - level) / (y0 - y))
        previous = (x, y)
    return None


def slope(points: Sequence[tuple[float, float]], last: int = 4) -> float | None:
    """The least-squares slope of the last ``last`` points (per unit of x): how fast a curve
    still falls at the end of its budget."""
    tail = list(points)[-last:]
    if len(tail) < 2:
        return None
    n = len(tail)
    mx, my = sum(x for x, _ in tail) / n, sum(y for _, y in tail) / n
    sxx = sum((x - mx) ** 2 for x, _ in tail)
    return sum((x - mx) * (y - my) for x, y in tail) / sxx if sxx else None


def commits(found: dict) -> list[str]:
    """The commits the table's jobs ran at, in first-seen order."""
    return list(dict.fromkeys(r["commit"] for r in found["rows"] if r["commit"]))


def parallel_jobs(found: dict) -> int:
    """The most jobs that ran at once in the table (from each job's recorded cost)."""
    return max((r["cost"] or {}).get("parallel_jobs", 1) for r in found["rows"])


def machine() -> str:
    """This machine in words: what a reader needs to compare a timing or a budget."""
    return f"{platform.machine()}, {os.cpu_count()} CPU cores, {platform.system()}"


def header(commands: Sequence[str], used: Sequence[str], jobs: int) -> str:
    """A results doc's generated header: the fields tests/test_docs_index.py requires."""
    # the first command on the field's line (tests/test_docs_index.py reads `- **Field:** value`)
    command = "".join(f"\n  `{c}`" if i else f" `{c}`" for i, c in enumerate(commands))
    return "\n".join(
        [
            f"- **Command:**{command}",
            f"- **Commits:** {', '.join(f'`{c[:12]}`' for c in used) or 'not recorded'}",
            f"- **Date:** {datetime.date.today().isoformat()}",
            f"- **Machine:** {machine()}; at most {jobs} job(s) shared it at once",
            "",
        ]
    )


def finite(value):
    """``value`` with every dict that holds an infinite or NaN number rewritten by
    ``finite_row`` (None there, the key named in ``infinite``), at any depth: JSON has no
    Infinity, and one convention serves every results file."""
    if isinstance(value, dict):
        value = {k: finite(v) for k, v in value.items()}
        odd = any(isinstance(v, float) and not math.isfinite(v) for v in value.values())
        return finite_row(value) if odd else value
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def write(
    name: str,
    title: str,
    body: str,
    payload: dict,
    commands: Sequence[str],
    found: dict,
    folder: Path = RESULTS,
) -> Path:
    """``<folder>/<name>.md`` (title, generated header, body, then the reading kept from the
    last version after ``END``) and ``<name>.json`` (the payload with the command, commits,
    date and machine), written atomically; ``folder`` is docs/results/ unless a smoke run
    says otherwise."""
    used, jobs = commits(found), parallel_jobs(found)
    folder.mkdir(parents=True, exist_ok=True)
    record = {
        "command": " && ".join(commands),
        "commits": used,
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "parallel_jobs": jobs,
    }
    text = json.dumps(finite(record | payload), indent=2, allow_nan=False)
    atomic_write_text(folder / f"{name}.json", text + "\n")
    path = folder / f"{name}.md"
    old = path.read_text(encoding="utf-8") if path.is_file() else ""
    reading = old[old.index(END) + len(END) :] if END in old else "\n"
    text = f"# {title}\n\n{header(commands, used, jobs)}\n{body}\n{END}{reading}"
    atomic_write_text(path, text)
    return path


def evaluate_children(
    script: Path, specs: list[dict], out_dir: Path, jobs: int, options: list[str]
) -> list[dict]:
    """Every spec's rows, from ``script --evaluate-one SPEC --out OUT/<name>.json *options`` in a
    child process of its own (a model's evaluation never shares torch's state with another's),
    ``jobs`` at a time; a spec whose file exists is read, not evaluated again."""
    out_dir.mkdir(parents=True, exist_ok=True)

    def one(spec: dict) -> list[dict]:
        path = out_dir / f"{spec['name']}.json"
        if not path.is_file():
            cmd = [sys.executable, str(script), "--evaluate-one", json.dumps(spec)]
            subprocess.run([*cmd, "--out", str(path), *options], check=True)
        return json.loads(path.read_text())

    with ThreadPoolExecutor(jobs) as pool:
        return [row for rows in pool.map(one, specs) for row in rows]


def sampler_at(process: str, sampler, temperature: float):
    """(the sampler, the gaussian x0 temperature): gaussian's temperature goes to its sampling
    denoiser, every token sampler draws at it itself (``with_temperature``)."""
    from cdlm.generation import with_temperature

    if process == "gaussian":
        return sampler, temperature
    return with_temperature(sampler, temperature), 1.0


def fmt(v: object, digits: int = 2) -> str:
    """A table cell: a float to ``digits`` places, None or NaN as a dash."""
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def markdown_table(columns: Sequence[str], cells: Sequence[Sequence[object]]) -> str:
    """A markdown table; floats to 4 significant digits, None as a dash."""

    def cell(v: object) -> str:
        if v is None:
            return "-"
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in cells]
    return "\n".join(lines) + "\n"


def configs(process: str, world: bool, length: int) -> list[tuple[str, str, dict, int, float]]:
    """(label, sampler, options, steps, temperature) for one model."""
    out = []
    for i, (label, name, options, counts) in enumerate(SAMPLERS[process]):
        counts = counts or [length]
        frontier = [] if world or i > 0 else list(FRONTIER_T)
        for steps in counts:
            temps = frontier if process == "autoregressive" or steps in FRONTIER_STEPS else []
            out += [(label, name, options, steps, t) for t in (1.0, *temps)]
    return out


def sample_rows(spec: dict, num_samples: int, likelihood_sequences: int) -> list[dict]:
    """Every config of one model (``spec``: ``ckpt``, ``row``, ``name``, a student's ``steps``):
    samples scored by its world or by SmolLM2-135M beside their entropy, and its bound (the
    world's: minus the entropy rate, excess bits)."""
    import torch

    from cdlm.evaluation.bound import val_bits_per_token
    from cdlm.evaluation.harness import text_quality
    from cdlm.evaluation.quality import load_scorer
    from cdlm.evaluation.world_score import canvas, world_of, world_quality, world_sections
    from cdlm.generation import Plan, generate, named_sampler
    from cdlm.likelihood.evaluate import validation_tokens
    from cdlm.model_file import load_model
    from cdlm.rng import generator

    torch.set_num_threads(1)
    model = load_model(spec["ckpt"])
    process, length = model.process.kind, model.config["seq_len"]
    world = model.config.get("world")
    judge = world_of(model, world) if world else None
    scorer = None if world else load_scorer(None)
    found = configs(process, bool(world), length)
    if spec.get("steps"):  # a DCD student: its own step count, its recorded sampler
        found = [("duo_ancestral", "duo_ancestral", {}, spec["steps"], 1.0)]
    rows, bound = [], None
    for label, name, options, steps, temperature in found:
        sampler, x0_t = sampler_at(process, named_sampler(name, **options), temperature)
        plan = Plan(
            num_samples=num_samples,
            seq_len=length,
            steps=steps,
            seed=0,
            denoising={"temperature": x0_t},
            cut_at_eos=False,
        )
        gen = generate(model, sampler, plan)
        ids = [s.token_ids for s in gen.samples]
        if judge is not None:
            if bound is None:
                quality, bound = world_sections(
                    model, judge, world, gen.samples, 0, likelihood_sequences, 1
                )
            else:
                eos = model.tokenizer.eos_token_id
                quality = world_quality(
                    judge, world, canvas(ids, length, eos), generator=generator(0)
                )
            q = quality["samples"]
            scores = {k: q[k] for k in ("kl_rate", "kl_floor", "tv_rate", "tv_floor")}
            scores |= {"violation_rate": q["violation_rate"], "nll_truth": q["nll_truth"]}
            scores |= {"entropy": q.get("token_entropy_bits")}
        else:
            if bound is None:
                val = validation_tokens(model)[:likelihood_sequences]
                bound = val_bits_per_token(model, val, 0)
            q = text_quality(ids, [s.text for s in gen.samples], scorer)
            scores = {"gen_ppl": q.get("gen_ppl"), "entropy": q["token_entropy_bits"]}
        rows.append(
            spec["row"]
            | {
                "sampler": label,
                "steps": steps,
                "temperature": temperature,
                "nfe": gen.nfe,
                "bits_per_token": bound["bits_per_token"],
                "excess_bits": bound.get("excess_bits"),
                "revisions": gen.stats.get("revisions"),
                "example": gen.samples[0].text[:160],
            }
            | scores
        )
        print(f"{spec['name']}: {label} @{steps} T={temperature:g}: {scores}", flush=True)
    return rows
