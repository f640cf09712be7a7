"""The speed measurement (cdlm.evaluation.speed, memory, guard_share) on hand-built cases, and
its first-token figures on a tiny model."""

import math
import mmap
import sys
import time
from types import SimpleNamespace

import pytest
import torch

from cdlm.denoiser import NetworkDenoiser, Prediction
from cdlm.evaluation.guard_share import (
    EntropyGuard,
    GuardCounter,
    GuardedBlocks,
    ThresholdGuard,
)
from cdlm.evaluation.memory import PeakMemory, rss_reader
from cdlm.evaluation.speed import measure, timed_run
from cdlm.generation import Plan
from cdlm.generation.inputs import read_layout
from cdlm.model_file import load_model
from cdlm.processes.masked import MaskedProcess
from cdlm.samplers import uniform_grid
from cdlm.samplers.base import SampleOutput, StepInfo
from cdlm.samplers.masked import sample_block, sample_masked
from cdlm.samplers.rules import EntropyBounded, Threshold
from cdlm.schedules import LogLinearMaskSchedule

MASK, V = 4, 5  # ids 0..3, [MASK] = 4


def _allocate(mb: int, seconds: float) -> None:
    """Hold mb MiB of fresh resident pages. An anonymous mapping, not a tensor: malloc may serve a
    tensor from heap pages an earlier test freed but kept resident, and the RSS would not move."""
    page = mmap.PAGESIZE
    with mmap.mmap(-1, mb * 2**20) as big:
        for offset in range(0, len(big), page):
            big[offset] = 1  # touch every page
        time.sleep(seconds)


def test_a_rows_peak_memory_is_its_own():
    """A row that allocates 128 MiB reads at least that over its start, and a row after it that
    allocates nothing reads small: the lifetime maximum only grew down the table."""
    cpu = torch.device("cpu")
    with PeakMemory(cpu) as big:
        _allocate(128, 0.5)  # held long enough for the sampling thread to wake under load
    with PeakMemory(cpu) as small:
        time.sleep(0.05)
    assert big.result.kind == small.result.kind == "rss"
    assert big.result.above_start_mb > 100
    assert abs(small.result.above_start_mb) < 20
    assert small.result.peak_mb < big.result.peak_mb - 100  # not monotone by construction


def test_the_resident_set_without_psutil_reads_proc(monkeypatch):
    with_psutil = rss_reader()()
    monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil raises ImportError
    statm = rss_reader()
    assert statm.__name__ == "statm"
    assert statm() == pytest.approx(with_psutil, rel=0.1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_rows_cuda_peak_is_its_own():
    cuda = torch.device("cuda")
    with PeakMemory(cuda) as big:
        x = torch.ones(2**25, device=cuda)  # 128 MiB
        del x
    with PeakMemory(cuda) as small:
        torch.ones(16, device=cuda)
    assert big.result.kind == "cuda" and big.result.above_start_mb >= 128
    assert small.result.peak_mb < big.result.peak_mb - 100


def _logp(rows: list[list[float]]) -> torch.Tensor:
    """(L, V) log-probabilities over ids 0..3 from each position's probabilities; [MASK] -inf."""
    p = torch.tensor([[*r, 0.0] for r in rows], dtype=torch.float64)
    return p.log().float()


def _top(p: float) -> list[float]:
    return [p, *[(1 - p) / 3] * 3]


class Table(NetworkDenoiser):
    """A denoiser that predicts the same log-probabilities whatever the canvas."""

    def __init__(self, logp: torch.Tensor) -> None:
        self.logp = logp

    def __call__(self, x, t, positions=None, **kwargs):
        logp = self.logp if positions is None else self.logp[positions]
        return Prediction(logits=logp.expand(x.shape[0], -1, -1))


def _run_counted(sampler, table, guarded, **options):
    x = torch.full((2, table.logp.shape[0]), MASK)
    counter = GuardCounter(guarded, MASK, torch.ones(x.shape[1], dtype=torch.bool))
    out = sampler(
        table, x, uniform_grid(options.pop("steps")), callback=counter, stop_at_eos=False,
        **options,
    )  # fmt: skip
    assert not (out.x == MASK).any()
    return counter.share


def test_threshold_commits_by_guard_and_by_force_counted_by_hand():
    """Blocks of 4 in 3 steps each, threshold 0.9. Block 0 (p = .95, .3, .6, .92): step 1 commits
    positions 0 and 3 (guard), step 2 the best left, position 2 (0.6: forced, at least one),
    step 3 position 1 (the last step). Block 1 (p = .5 each): one forced a step, then two at
    the last: all forced. Per row 2 by the guard, 6 by force."""
    table = Table(_logp([_top(p) for p in (0.95, 0.3, 0.6, 0.92, 0.5, 0.5, 0.5, 0.5)]))
    process = SimpleNamespace(
        mask_id=MASK, block_size=4, eos_id=None, schedule=LogLinearMaskSchedule(eps=0.0)
    )
    share = _run_counted(
        sample_block, table, GuardedBlocks(ThresholdGuard(0.9), 4), process=process,
        rule=Threshold(temperature=0.0, threshold=0.9), cache=None, steps_per_block=3, steps=6,
    )  # fmt: skip
    assert (share.by_guard, share.by_force) == (2 * 2, 2 * 6)
    assert share.guard_fraction == pytest.approx(0.25)


def test_entropy_bounded_commits_by_guard_and_by_force_counted_by_hand():
    """Blocks of 4, gamma 0.5 nats, whole-canvas calls. Block 0 (entropies 0, 0, ln 2, ln 4):
    step 1 commits the three whose preceding sum is <= 0.5: the first at least one (forced),
    two by the guard; step 2 the last one (forced). Block 1 (ln 4 each): one a step, all forced.
    Per row 2 by the guard, 6 by force."""
    one, two, four = [1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0], [0.25] * 4
    table = Table(_logp([one, one, two, four, four, four, four, four]))
    process = MaskedProcess(vocab_size=V, mask_id=MASK, schedule=LogLinearMaskSchedule(eps=0.0))
    share = _run_counted(
        sample_masked, table, GuardedBlocks(EntropyGuard(0.5), 4), process=process,
        rule=EntropyBounded(gamma=0.5), block_length=4, steps=8,
    )  # fmt: skip
    assert (share.by_guard, share.by_force) == (2 * 2, 2 * 6)
    assert math.log(2) > 0.5  # position 3 waits: 0 + 0 + ln 2 is over the budget


def test_a_step_window_that_fits_no_block_is_refused():
    counter = GuardCounter(GuardedBlocks(ThresholdGuard(0.9), 4), MASK, torch.ones(8).bool())
    x = torch.full((1, 8), MASK)
    x[0, 0] = 1
    with pytest.raises(ValueError, match="neither the canvas"):
        counter(StepInfo(i=0, t=1.0, s=0.5, x=x, prediction=Prediction(torch.zeros(1, 3, V))))


def _scripted(denoiser, x, timesteps, *, process, generator=None, callback=None):
    """Writes the first new position at step 1, revises it at step 2 beside the second, fills
    the rest at step 3 (a step before each sleeps 20 ms); reports its own ``stats``."""
    new = (x == process.mask_id).nonzero()[:, 1].unique()
    states = [x.clone()]
    for fill in ((new[:1], 5), (new[:2], 6), (new[2:], 8)):
        states.append(states[-1].clone())
        states[-1][:, fill[0]] = fill[1]
    for i, state in enumerate(states):
        time.sleep(0.02)
        callback(StepInfo(i=i, t=1.0, s=0.0, x=state, prediction=None))
    return SampleOutput(
        states[-1], states[-1], None, nfe=len(states), stats={"accepted_per_call": 2.5}
    )


_scripted.processes, _scripted.sampler_name = ("masked",), "scripted"


def test_first_token_and_first_stable_token_on_a_sampler_that_revises(tiny_masked_checkpoint):
    """The first new token is written at step 1 (after 40 ms) and revised at step 2; the first
    that stays is from step 2 (60 ms): the prompt's given tokens, unchanged from step 0, are
    not the first stable token. The sampler's own stats reach the measurement."""
    model = load_model(str(tiny_masked_checkpoint))
    layout = read_layout(model, 16, prompt="the cat")
    plan = Plan(2, 16, steps=4, layout=layout, cut_at_eos=False)
    _, stats = timed_run(model, _scripted, plan)
    assert 0.04 <= stats.first_token_seconds < 0.06 <= stats.first_stable_seconds
    assert stats.stats == {"accepted_per_call": 2.5}
    measured = measure(model, _scripted, plan, repeats=2)
    assert measured.sampler_stats["accepted_per_call"]["median"] == 2.5
    assert measured.as_dict()["guard"] is None and measured.memory.kind == "rss"
