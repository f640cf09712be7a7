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
from dataclasses import asdict, dataclass

import torch

from cdlm.generate import Generation, generate
from cdlm.model_file import Model
from cdlm.samplers.base import StepInfo


@dataclass
class RunStats:
    wall_seconds: float
    nfe: int
    positions: int  # per sequence
    final_tokens: int  # all samples, after cutting at EOS
    tokens_per_sec: float  # final tokens / wall seconds
    revision_rounds: int | None
    first_stable_seconds: float | None


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


def timed_run(model: Model, sampler: Callable, **kwargs) -> tuple[Generation, RunStats]:
    """One generation of all samples in a single batch (the batch size is ``num_samples``)."""
    device = next(model.network.parameters()).device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    tracker = _Tracker()
    gen = generate(
        model.process,
        model.network,
        model.tokenizer,
        sampler,
        callback=tracker,
        batch_size=None,
        **kwargs,
    )
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    final = sum(len(s.token_ids) for s in gen.samples)
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


def measure(model: Model, sampler: Callable, repeats: int, **kwargs) -> dict:
    """A warm-up run, then ``repeats`` runs with the same seed; returns the samples of the first
    timed run and every statistic as min/median/max, plus each raw run."""
    device = next(model.network.parameters()).device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    _, warmup = timed_run(model, sampler, **kwargs)
    runs, first = [], None
    for _ in range(repeats):
        gen, stats = timed_run(model, sampler, **kwargs)
        first = first or gen
        runs.append(stats)
    fields = RunStats.__dataclass_fields__
    return {
        "generation": first,
        "warmup": asdict(warmup),
        "steady": {name: spread([getattr(r, name) for r in runs]) for name in fields},
        "runs": [asdict(r) for r in runs],
        "peak_memory_mb": peak_memory_mb(device),
    }
