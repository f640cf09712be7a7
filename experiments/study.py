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
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cdlm.io import atomic_write_text
from cdlm.run import logs
from cdlm.run.table import collect

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
END = "<!-- end generated -->"  # a results doc's reading after it survives regeneration


def table(*folders: Path) -> dict:
    """The jobs of the study's sweep folders, as ``cdlm-table`` collects them; each row also
    gets its job's ``folder``."""
    roots = [Path(f) for f in folders]
    found = collect(roots)
    for row in found["rows"]:
        row["folder"] = str(roots[0] / row["job"]) if len(roots) == 1 else row["job"]
    return found


def rows(found: dict, status: str = "finished") -> list[dict]:
    """The table's rows with this status."""
    return [r for r in found["rows"] if r["status"] == status]


def job_curve(row: dict, metric: str) -> list[tuple[int, float]]:
    """``(step, value)`` of ``metric`` over a training job (its CSV or W&B log)."""
    return logs.curve(logs.rows(Path(row["folder"])), metric)


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
    command = "".join(f"\n  `{c}`" for c in commands)
    return "\n".join(
        [
            f"- **Command:**{command}",
            f"- **Commits:** {', '.join(f'`{c[:12]}`' for c in used) or 'not recorded'}",
            f"- **Date:** {datetime.date.today().isoformat()}",
            f"- **Machine:** {machine()}; at most {jobs} job(s) shared it at once",
            "",
        ]
    )


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
    atomic_write_text(folder / f"{name}.json", json.dumps(record | payload, indent=2) + "\n")
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


def markdown_table(columns: Sequence[str], cells: Sequence[Sequence[object]]) -> str:
    """A markdown table; floats to 4 significant digits, None as a dash."""

    def cell(v: object) -> str:
        if v is None:
            return "-"
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in cells]
    return "\n".join(lines) + "\n"
