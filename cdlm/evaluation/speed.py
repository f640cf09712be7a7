"""Speed and work of a sampler, measured honestly.

One untimed-for-the-summary warm-up run is reported apart; then every repeated run is kept and
summarised as min / median / max (never best-of). Work counts what the network really did:
NFE and positions processed (network evaluations x positions), not only the tokens that remain.
For samplers whose state is tokens (masked, autoregressive), each run also counts revision rounds
(steps that changed at least one token) and the time until the first token that never changes
again was written.
"""

from __future__ import annotations

import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace

import torch

from cdlm.model_file import Model
from cdlm.progress import Progress
from cdlm.samplers.base import StepInfo
from cdlm.sampling import Generation, Plan, generate


@dataclass
class RunStats:
    wall_seconds: float
    nfe: int
    positions: int  # per sequence
    final_tokens: int  # generated tokens of all samples (``generated_tokens``)
    tokens_per_sec: float  # final tokens / wall seconds
    revision_rounds: int | None
    first_stable_seconds: float | None


RUN_FIELDS = [f.name for f in fields(RunStats)]


class _Tracker:
    """Step callback: times each step and keeps token states to find when tokens settled."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.times: list[float] = []
        self.states: list[torch.Tensor] = []

    def __call__(self, info: StepInfo) -> None:
        self.times.append(time.perf_counter() - self.start)
        if not info.x.is_floating_point():
            self.states.append(info.x.detach().clone())

    def revision_stats(self, undecided: int | None) -> tuple[int | None, float | None]:
        if not self.states:
            return None, None
        states = torch.stack(self.states)  # (steps, B, L)
        previous = torch.cat([torch.full_like(states[:1], -1), states[:-1]])
        changed = states != previous
        rounds = int(changed.flatten(1).any(-1).sum())
        # A position is stable from the step of its last change; undecided (mask) values count
        # as not written yet.
        steps = torch.arange(len(states), device=states.device)[:, None, None]
        last_change = torch.where(changed, steps, -1).amax(0)
        written = states[-1] != (undecided if undecided is not None else -1)
        if not written.any():
            return rounds, None
        return rounds, self.times[int(last_change[written].min())]


def peak_memory_mb(device: torch.device) -> float:
    """CUDA allocator peak on GPU; else the process's peak resident set (KiB on Linux)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def generated_tokens(gen: Generation, plan: Plan) -> int:
    """The tokens the sampler generated, all samples: each sample's ids after cutting at EOS,
    and with a layout only its editable positions among them (a prompt's fixed tokens are
    given, not generated, and would make a prompted run look faster than it is)."""
    if plan.layout is None:
        return sum(len(s.token_ids) for s in gen.samples)
    editable = plan.layout.editable
    return sum(sum(editable[: len(s.token_ids)]) for s in gen.samples)


def timed_run(model: Model, sampler: Callable, plan: Plan) -> tuple[Generation, RunStats]:
    """One generation of all samples in a single batch (the batch size is ``num_samples``)."""
    plan = replace(plan, batch_size=None)
    device = next(model.network.parameters()).device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    tracker = _Tracker()
    gen = generate(model, sampler, plan, callback=tracker)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    final = generated_tokens(gen, plan)
    rounds, first_stable = tracker.revision_stats(getattr(model.process, "mask_id", None))
    return gen, RunStats(
        wall_seconds=gen.wall_seconds,
        nfe=gen.nfe,
        positions=gen.positions,
        final_tokens=final,
        tokens_per_sec=final / gen.wall_seconds if gen.wall_seconds else float("nan"),
        revision_rounds=rounds,
        first_stable_seconds=first_stable,
    )


def spread(values: list[float | int | None]) -> dict[str, float] | None:
    """min / median / max of repeated runs (None when the metric does not apply)."""
    kept = [v for v in values if v is not None]
    if not kept:
        return None
    return {"min": min(kept), "median": statistics.median(kept), "max": max(kept)}


@dataclass
class Measurement:
    """A warm-up run, the timed runs, the samples of the first timed run (``generation``) and
    the peak memory over them all."""

    generation: Generation
    warmup: RunStats
    runs: list[RunStats]
    peak_memory_mb: float

    @property
    def steady(self) -> dict[str, dict[str, float] | None]:
        """Every statistic of the timed runs as min / median / max."""
        return {name: spread([getattr(r, name) for r in self.runs]) for name in RUN_FIELDS}

    def as_dict(self) -> dict:
        """The report's ``speed`` section (without the samples)."""
        return {
            "warmup": asdict(self.warmup),
            "steady": self.steady,
            "runs": [asdict(r) for r in self.runs],
            "peak_memory_mb": self.peak_memory_mb,
        }


def measure(model: Model, sampler: Callable, plan: Plan, repeats: int) -> Measurement:
    """A warm-up run, then ``repeats`` runs of the same plan (the same seed)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    device = next(model.network.parameters()).device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with Progress(repeats + 1, "sampling run (the first: warm-up)") as bar:
        _, warmup = timed_run(model, sampler, plan)
        bar.update()  # between runs: outside what a run times
        timed = []
        for _ in range(repeats):
            timed.append(timed_run(model, sampler, plan))
            bar.update()
    return Measurement(
        generation=timed[0][0],
        warmup=warmup,
        runs=[stats for _, stats in timed],
        peak_memory_mb=peak_memory_mb(device),
    )
