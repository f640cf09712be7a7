"""Speed and work of a sampler, measured honestly.

One warm-up run is reported apart; then every repeated run is kept and summarised as min /
median / max (never best-of). Work counts what the network really did: NFE and positions
processed (network evaluations x positions), not only the tokens that remain. For samplers whose
state is tokens (masked, block, autoregressive), each run also counts revision rounds (steps that
changed at least one generated position), the time until the first generated token was written
(a position left the starting canvas: [MASK], or AR's fill, so AR's first step, or with a prompt
its first new token) and the time until the first token that never changed again was written.
The masked and block samplers never revise a committed token, so for them the two times agree;
a sampler that may revise (a draft later rejected) reads later on the second. The prompt's given
positions count for neither.
Memory is the peak of the measurement itself (``cdlm.evaluation.memory``), and a guarded row's
warm-up run counts which tokens its guard committed (``cdlm.evaluation.guard_share``).
"""

from __future__ import annotations

import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace

import torch

from cdlm.evaluation.guard_share import GuardCounter, GuardedBlocks, GuardShare
from cdlm.evaluation.memory import MemoryPeak, PeakMemory
from cdlm.generation import Generation, Plan, generate
from cdlm.model_file import Model
from cdlm.progress import Progress
from cdlm.samplers.base import Callback, StepInfo


@dataclass
class RunStats:
    wall_seconds: float
    nfe: int
    positions: int  # per sequence
    final_tokens: int  # generated tokens of all samples (``generated_tokens``)
    tokens_per_sec: float  # final tokens / wall seconds
    revision_rounds: int | None
    first_token_seconds: float | None
    first_stable_seconds: float | None
    stats: dict[str, float] = field(default_factory=dict)  # the sampler's own (Generation.stats)


RUN_FIELDS = [f.name for f in fields(RunStats) if f.name != "stats"]


class _Tracker:
    """Step callback: times each step and keeps token states to find when tokens were written
    and when they settled, counting only ``editable`` (L,) positions (a prompt is given)."""

    def __init__(self, editable: torch.Tensor, also: Callback | None) -> None:
        self.editable, self.also = editable, also
        self.start = time.perf_counter()
        self.times: list[float] = []
        self.states: list[torch.Tensor] = []

    def __call__(self, info: StepInfo) -> None:
        self.times.append(time.perf_counter() - self.start)
        if not info.x.is_floating_point():
            self.states.append(info.x.detach().clone())
        if self.also is not None:
            self.also(info)

    def first_times(self, start: int | None) -> tuple[int | None, float | None, float | None]:
        """Revision rounds (steps that changed a new position), the time of the step that first
        changed one from the starting canvas (every position ``start``: [MASK], or AR's fill)
        and of the step after which the first of them never changed again."""
        if not self.states:
            return None, None, None
        states = torch.stack(self.states)  # (steps, B, L)
        before = torch.full_like(states[:1], -1 if start is None else start)
        changed = (states != torch.cat([before, states[:-1]])) & self.editable.to(states.device)
        stepped = changed.flatten(1).any(-1)
        if not stepped.any():
            return 0, None, None
        steps = torch.arange(len(states), device=states.device)[:, None, None]
        last_change = torch.where(changed, steps, -1).amax(0)  # -1: never written
        first = self.times[int(stepped.nonzero()[0])]
        return int(stepped.sum()), first, self.times[int(last_change[last_change >= 0].min())]


def peak_memory_mb(device: torch.device) -> float:
    """The process's lifetime peak: CUDA's allocator peak on GPU, else the peak resident set
    (KiB on Linux). Training logs it once at its end; a stretch of work inside a process reads
    its own with ``memory.PeakMemory``."""
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


def _editable(plan: Plan) -> torch.Tensor:
    if plan.layout is None:
        return torch.ones(plan.seq_len, dtype=torch.bool)
    return torch.tensor(plan.layout.editable)


def timed_run(
    model: Model, sampler: Callable, plan: Plan, also: Callback | None = None
) -> tuple[Generation, RunStats]:
    """One generation of all samples in a single batch (the batch size is ``num_samples``);
    ``also`` sees every step too (inside the timed run: keep it cheap, or use it on a warm-up)."""
    plan = replace(plan, batch_size=None)
    device = next(model.network.parameters()).device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    tracker = _Tracker(_editable(plan).to(device), also)
    gen = generate(model, sampler, plan, callback=tracker)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    final = generated_tokens(gen, plan)
    rounds, first, stable = tracker.first_times(model.process.canvas_id)
    return gen, RunStats(
        wall_seconds=gen.wall_seconds,
        nfe=gen.nfe,
        positions=gen.positions,
        final_tokens=final,
        tokens_per_sec=final / gen.wall_seconds if gen.wall_seconds else float("nan"),
        revision_rounds=rounds,
        first_token_seconds=first,
        first_stable_seconds=stable,
        stats=dict(gen.stats),
    )


def spread(values: list[float | int | None]) -> dict[str, float] | None:
    """min / median / max of repeated runs (None when the metric does not apply)."""
    kept = [v for v in values if v is not None]
    if not kept:
        return None
    return {"min": min(kept), "median": statistics.median(kept), "max": max(kept)}


@dataclass
class Measurement:
    """A warm-up run, the timed runs, the samples of the first timed run (``generation``), the
    peak memory of them all (this measurement's own), and for a guarded row the tokens its
    guard committed in the warm-up run (the timed runs repeat its seed, so its samples)."""

    generation: Generation
    warmup: RunStats
    runs: list[RunStats]
    memory: MemoryPeak
    guard: GuardShare | None = None

    @property
    def steady(self) -> dict[str, dict[str, float] | None]:
        """Every statistic of the timed runs as min / median / max."""
        return {name: spread([getattr(r, name) for r in self.runs]) for name in RUN_FIELDS}

    @property
    def sampler_stats(self) -> dict[str, dict[str, float] | None]:
        """The sampler's own statistics (``Generation.stats``) of the timed runs."""
        names = sorted({k for r in self.runs for k in r.stats})
        return {k: spread([r.stats.get(k) for r in self.runs]) for k in names}

    def as_dict(self) -> dict:
        """The report's ``speed`` section (without the samples)."""
        guard = None
        if self.guard is not None:
            guard = asdict(self.guard) | {"guard_fraction": self.guard.guard_fraction}
        return {
            "warmup": asdict(self.warmup),
            "steady": self.steady,
            "sampler_stats": self.sampler_stats,
            "runs": [asdict(r) for r in self.runs],
            "memory_kind": self.memory.kind,
            "peak_memory_mb": self.memory.peak_mb,
            "peak_memory_above_start_mb": self.memory.above_start_mb,
            "guard": guard,
        }


def measure(
    model: Model,
    sampler: Callable,
    plan: Plan,
    repeats: int,
    guarded: GuardedBlocks | None = None,
) -> Measurement:
    """A warm-up run, then ``repeats`` runs of the same plan (the same seed). ``guarded``: count
    the tokens that guard committed, in the warm-up run (its callback stays out of the timing)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    device = next(model.network.parameters()).device
    counter = None
    if guarded is not None:
        counter = GuardCounter(guarded, model.process.mask_id, _editable(plan).to(device))
    bar = Progress(repeats + 1, "sampling run (the first: warm-up)")
    with PeakMemory(device) as memory, bar:
        _, warmup = timed_run(model, sampler, plan, counter)
        bar.update()  # between runs: outside what a run times
        timed = []
        for _ in range(repeats):
            timed.append(timed_run(model, sampler, plan))
            bar.update()
    return Measurement(
        generation=timed[0][0],
        warmup=warmup,
        runs=[stats for _, stats in timed],
        memory=memory.result,
        guard=None if counter is None else counter.share,
    )
