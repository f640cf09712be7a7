"""Every timestep grid: steps + 1 strictly decreasing points from exactly 1 to exactly 0."""

import pytest
import torch

from cdlm.samplers import GRIDS, make_grid
from cdlm.schedules import CosineSchedule, LinearSchedule, SqrtSchedule
from cdlm.time_samplers import Warped

SCHEDULES = [CosineSchedule(), LinearSchedule(), SqrtSchedule()]


@pytest.mark.parametrize("name", sorted(GRIDS))
@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: type(s).__name__)
@pytest.mark.parametrize("steps", [1, 2, 17, 200])
def test_grid_shape_endpoints_and_monotone(name, schedule, steps):
    warped = Warped(bins=20)  # a learned warping: the loss rising over the upper half
    warped.observe(torch.linspace(0.025, 0.975, 20), torch.linspace(-1, 1, 20).clamp_min(0))
    grid = make_grid(name, steps, schedule, warp=warped.quantile)
    assert grid.shape == (steps + 1,) and grid.dtype == torch.float64
    assert grid[0] == 1.0 and grid[-1] == 0.0
    assert (grid[1:] < grid[:-1]).all()


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: type(s).__name__)
def test_logsnr_grid_is_evenly_spaced_in_logsnr(schedule):
    logsnr = schedule.logsnr(make_grid("logsnr", 10, schedule))
    torch.testing.assert_close(logsnr.diff(), logsnr.diff()[:1].expand(10), atol=1e-9, rtol=0)


def test_karras_grid_is_evenly_spaced_in_sigma_to_the_one_over_rho():
    schedule = CosineSchedule()
    sigma = (-schedule.logsnr(make_grid("karras", 12, schedule)) / 2).exp()
    spacing = (sigma ** (1 / 7)).diff()
    torch.testing.assert_close(spacing, spacing[:1].expand(12), atol=1e-9, rtol=0)


def test_bad_grids_are_refused():
    with pytest.raises(ValueError, match="unknown grid 'nope'; valid: uniform, logsnr, karras"):
        make_grid("nope", 4)
    with pytest.raises(ValueError, match="needs the process's noise schedule"):
        make_grid("logsnr", 4)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        make_grid("karras", 0, CosineSchedule())
