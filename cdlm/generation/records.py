"""The per-sample records that ``cdlm-sample`` prints and writes as JSONL."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cdlm.generation.plan import Generation
from cdlm.generation.rows import RowsGeneration
from cdlm.regions import Layout, assemble


@dataclass(frozen=True)
class RunFacts:
    """What every record of one run shares: how it was drawn."""

    sampler: str
    steps: int
    seed: int
    label: str | None = None
    scale: float | None = None  # None: not guided
    guidance_on: str | None = None  # label | prompt | both; None: not guided


def records(
    gen: Generation, layout: Layout | None, tokenizer, facts: RunFacts, first_index: int = 0
) -> list[dict[str, Any]]:
    """One record per sample: its text (with a layout, the assembled canvas and its region map
    from input to output), token ids, and how it was drawn."""
    out = []
    for i, s in enumerate(gen.samples):
        record: dict[str, Any] = {
            "index": first_index + i,
            "text": s.text,
            "token_ids": s.token_ids,
        }
        if layout is not None:
            text, regions = assemble(layout, s.token_ids, tokenizer)
            record |= {"text": text, "regions": [r.as_dict() for r in regions]}
        out.append(
            record
            | {
                "label": facts.label,
                "scale": facts.scale,
                "guidance_on": facts.guidance_on,
                "sampler": facts.sampler,
                "steps": facts.steps,
                "nfe": gen.nfe,
                "positions": gen.positions,
                "wall_seconds": round(gen.wall_seconds, 4),
                **({"stats": gen.stats} if gen.stats else {}),
                "seed": facts.seed,
            }
        )
    return out


def headline(record: dict[str, Any]) -> str:
    """A record as printed: ``[index] (what guided it, scale) text``."""
    on, label = record["guidance_on"], record["label"]
    if on is None:
        return f"[{record['index']}] {record['text']}"
    what = {"label": f"label {label}", "prompt": "prompt guidance"}.get(
        on, f"label {label} and prompt"
    )
    return f"[{record['index']}] ({what}, scale {record['scale']:g}) {record['text']}"


def row_records(
    gen: RowsGeneration,
    sampler: str,
    steps: int,
    per_line: int,
    scale: float | None = None,
    guidance_on: str | None = None,
    first_index: int = 0,
) -> list[dict[str, Any]]:
    """One record per row of a prompts file (``num_samples`` = ``per_line`` per line): its
    line, the assembled text and region map, the completion after a prompt, its seed, and the
    guidance it was drawn under (``scale`` None: unguided); indices start at ``first_index``."""
    return [
        {
            "index": first_index + i,
            "line": i // per_line + 1,
            "text": r.text,
            "completion": r.completion,
            "regions": [region.as_dict() for region in r.regions],
            "token_ids": r.token_ids,
            "label": None,
            "scale": scale,
            "guidance_on": guidance_on,
            "sampler": sampler,
            "steps": steps,
            "nfe": gen.nfe,
            "positions": gen.positions,
            "wall_seconds": round(gen.wall_seconds, 4),
            "seed": r.seed,
        }
        for i, r in enumerate(gen.rows)
    ]
