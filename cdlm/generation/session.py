"""One ``cdlm-sample`` session: the same plan at each guidance scale, with a progress bar and,
when asked, the denoising canvas recorded (``cdlm.canvas``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import torch

from cdlm.canvas import LiveCanvas, Recorder
from cdlm.generation.generate import generate
from cdlm.generation.plan import Generation, Plan
from cdlm.generation.records import RunFacts, records
from cdlm.guidance import Guidance
from cdlm.model_file import Model
from cdlm.progress import Progress
from cdlm.samplers.base import sampler_name


@dataclass
class ScaleRun:
    """The samples drawn at one guidance ``scale``: the generation, its records, and the canvas
    recorder (None unless asked for)."""

    scale: float
    generation: Generation
    records: list[dict]
    recorder: Recorder | None


@dataclass(frozen=True)
class View:
    """How a session shows itself: a progress bar (on a terminal), the live canvas of sample 0
    (``live``), and whether every step is recorded for a saved canvas (``record``)."""

    progress: bool = True
    live: bool = False
    record: bool = False


def sample_scales(
    model: Model,
    sampler: Callable,
    plan: Plan,
    scales: list[float],
    label: tuple[int, str] | None = None,
    on: str = "auto",
    view: View = View(),
) -> Iterator[ScaleRun]:
    """Draws ``plan`` once per guidance scale, guided on ``label`` (index, name) and/or the
    layout's fixed text as ``on`` says (``cdlm.guidance.Guidance``); record indices run on
    across scales."""
    index = label[0] if label is not None else None
    per_batch = plan.seq_len if model.process.sequential else plan.steps  # callbacks per batch
    first = 0
    for w in scales:
        guidance = Guidance(index, w, on)
        run_plan = replace(plan, guidance=guidance)
        recorder = _recorder(model, run_plan, per_batch, view)
        on_ = guidance.guided_on(plan.prompted, scales)
        with Progress(
            len(plan.batches()) * per_batch,
            f"cdlm-sample: scale {w:g}, step" if on_ else "cdlm-sample: step",
            enabled=view.progress and not view.live,  # the live canvas shows the steps itself
        ) as bar:

            def step(info, bar=bar, recorder=recorder) -> None:
                bar.update(1)
                if recorder is not None:
                    recorder(info)

            gen = generate(model, sampler, run_plan, callback=step)
        facts = RunFacts(
            sampler=sampler_name(sampler),
            steps=plan.steps,
            seed=plan.seed,
            label=label[1] if label is not None else None,
            scale=w if on_ else None,
            guidance_on=on_,
        )
        rows = records(gen, plan.layout, model.tokenizer, facts, first)
        first += len(rows)
        yield ScaleRun(w, gen, rows, recorder)


def _recorder(model: Model, plan: Plan, per_batch: int, view: View) -> Recorder | None:
    """The step recorder behind a live or saved canvas (None without either)."""
    if not (view.live or view.record):
        return None
    layout = plan.layout
    fixed = torch.tensor([not e for e in layout.editable]) if layout is not None else None
    live = LiveCanvas(model.tokenizer, fixed=fixed, steps=per_batch) if view.live else None
    return Recorder(model.process, fixed, plan.guidance.passes(plan.prompted), on_frame=live)
