import pytest
import torch

from cdlm.schedules import CosineSchedule, LinearSchedule, SqrtSchedule

SCHEDULES = [CosineSchedule(), CosineSchedule(-5.0, 8.0), LinearSchedule(), SqrtSchedule()]
T = torch.linspace(0.0, 1.0, 201, dtype=torch.float64)


@pytest.mark.parametrize("schedule", SCHEDULES, ids=repr)
def test_variance_preserving(schedule):
    a, s = schedule.alpha(T), schedule.sigma(T)
    torch.testing.assert_close(a**2 + s**2, torch.ones_like(T), atol=1e-12, rtol=0)


@pytest.mark.parametrize("schedule", SCHEDULES, ids=repr)
def test_monotone(schedule):
    assert (schedule.logsnr(T).diff() < 0).all()
    assert (schedule.alpha(T).diff() < 0).all()
    assert (schedule.sigma(T).diff() > 0).all()
    assert torch.isfinite(schedule.logsnr(T)).all()


@pytest.mark.parametrize("schedule", SCHEDULES, ids=repr)
def test_derivatives_match_autograd(schedule):
    t = torch.linspace(0.01, 0.99, 50, dtype=torch.float64, requires_grad=True)
    for value, derivative in (
        (schedule.logsnr, schedule.dlogsnr),
        (schedule.alpha, schedule.dalpha),
        (schedule.sigma, schedule.dsigma),
    ):
        (grad,) = torch.autograd.grad(value(t).sum(), t)
        torch.testing.assert_close(derivative(t.detach()), grad, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("schedule", SCHEDULES, ids=repr)
def test_t_from_logsnr_inverts(schedule):
    t = torch.linspace(0.02, 0.98, 25, dtype=torch.float64)
    torch.testing.assert_close(schedule.t_from_logsnr(schedule.logsnr(t)), t, atol=1e-9, rtol=0)


def test_cosine_endpoints_are_the_clipping_range():
    s = CosineSchedule(-7.0, 9.0)
    ends = s.logsnr(torch.tensor([0.0, 1.0], dtype=torch.float64))
    torch.testing.assert_close(ends, torch.tensor([9.0, -7.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="logsnr_min"):
        CosineSchedule(3.0, 1.0)
