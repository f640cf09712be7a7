"""Step distillation against closed forms: Gaussian data (whose posterior mean is exact) for the
progressive and consistency targets, a tiny vocabulary for SDTT's two-step teacher target, and
the guarantees of the module (teacher untouched, student self-contained)."""

import math

import pytest
import torch

from cdlm.denoiser import Prediction
from cdlm.distillation.methods import SDTT, Consistency, Progressive
from cdlm.distillation.module import Distillation, student_of
from cdlm.distillation.targets import (
    consistency_pair,
    ddim_to,
    divergence,
    halvings,
    progressive_target,
    sdtt_target,
)
from cdlm.networks.transformer import Transformer
from cdlm.processes.gaussian import GaussianProcess
from cdlm.processes.masked import MaskedProcess
from cdlm.processes.parameterization import PosteriorInput

D, MU, VAR = (
    3,
    torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64),
    torch.tensor([0.3, 1.5, 0.8], dtype=torch.float64),
)


def gaussian_process() -> GaussianProcess:
    return GaussianProcess(vocab_size=5, embed_dim=D).double()


class ExactTeacher:
    """E[x0 | z_t] for x0 ~ N(MU, diag(VAR)): the Bayes-optimal denoiser, linear in z_t."""

    def __init__(self, process):
        self.process = process

    def __call__(self, z, t, self_cond=None, **kw):
        a = self.process.schedule.alpha(t)[:, None, None]
        s = self.process.schedule.sigma(t)[:, None, None]
        gain = VAR * a / (a**2 * VAR + s**2)
        return Prediction(x0=MU + gain * (z - a * MU), logits=torch.zeros(*z.shape[:2], 5))


def test_progressive_target_makes_one_student_step_equal_two_teacher_steps():
    """One DDIM step with the target as x0 lands exactly where two teacher DDIM steps land."""
    process = gaussian_process()
    teacher = ExactTeacher(process)
    g = torch.Generator().manual_seed(0)
    z = torch.randn(64, 4, D, dtype=torch.float64, generator=g)
    for i in range(1, 9):  # every interval of an 8-step student grid, the last ending at 0
        t = torch.full((64,), i / 8, dtype=torch.float64)
        t_end = torch.full((64,), (i - 1) / 8, dtype=torch.float64)
        t_mid = (t + t_end) / 2
        target = progressive_target(teacher, process, z, t, t_mid, t_end)
        z_mid = ddim_to(process, z, teacher(z, t).x0, t, t_mid)
        two = ddim_to(process, z_mid, teacher(z_mid, t_mid).x0, t_mid, t_end)
        one = ddim_to(process, z, target, t, t_end)
        torch.testing.assert_close(one, two, atol=1e-10, rtol=0)


def test_one_progressive_round_fits_a_student_that_halves_the_steps():
    """On Gaussian data the progressive target is affine in z_t, so an affine student per grid
    time (fitted by least squares: the minimum of the progressive loss) samples in 4 DDIM steps
    exactly what the teacher samples in 8."""
    process = gaussian_process()
    teacher = ExactTeacher(process)
    g = torch.Generator().manual_seed(1)
    coef = {}
    for i in range(1, 5):
        t = torch.full((512,), i / 4, dtype=torch.float64)
        t_end = torch.full((512,), (i - 1) / 4, dtype=torch.float64)
        z = process.noised(
            MU + VAR.sqrt() * torch.randn(512, 1, D, generator=g, dtype=torch.float64),
            t,
            torch.randn(512, 1, D, generator=g, dtype=torch.float64),
        )
        target = progressive_target(teacher, process, z, t, (t + t_end) / 2, t_end)
        design = torch.cat([z, torch.ones_like(z)], 1).permute(2, 0, 1)  # (D, N, 2)
        coef[i] = torch.linalg.lstsq(design, target.permute(2, 0, 1)).solution  # (D, 2, 1)

    def student(z, t, self_cond=None, **kw):
        i = round(float(t[0]) * 4)
        a, b = coef[i][:, 0, 0], coef[i][:, 1, 0]
        return Prediction(x0=a * z + b, logits=None)

    def run(denoiser, steps, z):
        for i in range(steps, 0, -1):
            t = torch.full((z.shape[0],), i / steps, dtype=torch.float64)
            s = torch.full((z.shape[0],), (i - 1) / steps, dtype=torch.float64)
            z = ddim_to(process, z, denoiser(z, t).x0, t, s)
        return z

    z1 = torch.randn(32, 1, D, generator=g, dtype=torch.float64)
    torch.testing.assert_close(run(student, 4, z1), run(teacher, 8, z1), atol=1e-8, rtol=0)


def test_consistency_fixed_point_is_self_consistent_and_zeroes_the_loss():
    """The consistency function of the teacher's DDIM ODE solver, built from t_0 = 0 up by
    exact affine fits (the minimum of the consistency loss with the EMA target equal to the
    student), maps every point of one teacher trajectory to the same x0; the loss is 0 there
    and positive for a perturbed student."""
    process = gaussian_process()
    teacher = ExactTeacher(process)
    n_grid, g = 8, torch.Generator().manual_seed(2)
    coef = {0: (torch.ones(D, dtype=torch.float64), torch.zeros(D, dtype=torch.float64))}
    for n in range(1, n_grid + 1):
        t = torch.full((256,), n / n_grid, dtype=torch.float64)
        s = torch.full((256,), (n - 1) / n_grid, dtype=torch.float64)
        z = torch.randn(256, 1, D, generator=g, dtype=torch.float64) * 1.5
        z_now = consistency_pair(teacher, process, z, t, s)
        a, b = coef[n - 1]
        goal = z_now if n == 1 else a * z_now + b  # boundary: f(z, 0) = z
        design = torch.cat([z, torch.ones_like(z)], 1).permute(2, 0, 1)
        sol = torch.linalg.lstsq(design, goal.permute(2, 0, 1)).solution
        coef[n] = (sol[:, 0, 0], sol[:, 1, 0])

    table_a = torch.stack([coef[n][0] for n in range(n_grid + 1)])  # (grid + 1, D)
    table_b = torch.stack([coef[n][1] for n in range(n_grid + 1)])

    def student(z, t, self_cond=None, **kw):
        n = (t * n_grid).round().long()  # each row its own grid time
        x0 = table_a[n][:, None] * z + table_b[n][:, None]
        return Prediction(x0=x0, logits=torch.zeros(*z.shape[:2], 5, dtype=z.dtype))

    z = torch.randn(16, 1, D, generator=g, dtype=torch.float64)
    ends = []
    for n in range(n_grid, 0, -1):
        t = torch.full((16,), n / n_grid, dtype=torch.float64)
        ends.append(student(z, t).x0)
        z = consistency_pair(teacher, process, z, t, t - 1 / n_grid)
    for f in ends[1:]:
        torch.testing.assert_close(f, ends[0], atol=1e-8, rtol=0)
    torch.testing.assert_close(z, ends[0], atol=1e-8, rtol=0)  # the trajectory's own end

    # The loss of the method, with the student as its own EMA target, on embedded tokens.
    method = Consistency(solver_steps=n_grid, ce_weight=0.0)
    batch = {"tokens": torch.randint(0, 5, (64, 1))}
    with torch.no_grad():
        process.embedding.weight.copy_(
            MU.expand(5, D) + VAR.sqrt() * torch.randn(5, D, dtype=torch.float64)
        )
    out = method.loss(process, student, teacher, batch, 4, torch.Generator().manual_seed(3))
    assert float(out.loss) < 1e-12

    def perturbed(z, t, **kw):
        pred = student(z, t)
        return Prediction(x0=pred.x0 + 0.1 * float(t[0]), logits=pred.logits)

    out = method.loss(
        process, perturbed, teacher, batch, 4, torch.Generator().manual_seed(3), target=student
    )
    assert float(out.loss) > 1e-4


class ScriptedTeacher:
    """Returns log-probabilities that depend on the call: its i-th call returns ``logps[i]``."""

    def __init__(self, logps):
        self.logps, self.calls = logps, 0

    def __call__(self, z, t, self_cond=None, **kw):
        logp = self.logps[min(self.calls, len(self.logps) - 1)].expand(*z.shape, -1).clone()
        self.calls += 1
        return Prediction(logits=logp)


def test_sdtt_target_is_the_two_step_teacher_distribution():
    """Vocabulary {0, 1, 2} + [MASK] = 3. From t = 2 dt the first ancestral step reveals a masked
    position with probability (keep(t - dt) - keep(t)) / (1 - keep(t)) (= 1/2 for the log-linear
    schedule at t = 1, dt = 1/2) and the second reveals the rest: a masked position's target is
    the first call's distribution with that probability, else the second's; visible positions
    are not targets."""
    process = MaskedProcess(vocab_size=4, mask_id=3)
    first = torch.log(torch.tensor([0.7, 0.2, 0.1, 0.0]))
    second = torch.log(torch.tensor([0.1, 0.1, 0.8, 0.0]))
    n = 20_000
    z = torch.full((n, 2), 3)
    z[:, 1] = 0  # a visible token
    teacher = ScriptedTeacher([first, second])
    target = sdtt_target(teacher, process, z, 1.0, 0.5, 2, torch.Generator().manual_seed(0))
    assert teacher.calls == 2
    keep = process.schedule.keep
    p1 = float((keep(torch.tensor(0.5)) - keep(torch.tensor(1.0))) / (1 - keep(torch.tensor(1.0))))
    is_first = (target[:, 0] == first).all(-1)
    is_second = (target[:, 0] == second).all(-1)
    assert bool((is_first | is_second).all())
    assert abs(is_first.double().mean() - p1) < 4 * math.sqrt(p1 * (1 - p1) / n)
    assert bool((target[:, 1] == 0).all())


def test_divergences_are_the_named_kl_and_mse():
    s = torch.log(torch.tensor([[0.5, 0.5, 0.0]], dtype=torch.float64))
    q = torch.log(torch.tensor([[0.25, 0.75, 0.0]], dtype=torch.float64))
    rev = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    fwd = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)
    assert float(divergence(s, q, "reverse_kl")) == pytest.approx(rev, rel=1e-12)
    assert float(divergence(s, q, "forward_kl")) == pytest.approx(fwd, rel=1e-12)
    mse = (math.log(0.5) - math.log(0.25)) ** 2 + (math.log(0.5) - math.log(0.75)) ** 2
    assert float(divergence(s, q, "mse")) == pytest.approx(mse, rel=1e-12)
    with pytest.raises(ValueError, match="unknown divergence"):
        divergence(s, q, "l1")


def test_rounds_halve_to_the_end_count():
    assert halvings(64, 4) == [32, 16, 8, 4]
    assert halvings(2, 1) == [1]
    with pytest.raises(ValueError, match="powers of two"):
        halvings(48, 4)


def tiny_gaussian_teacher():
    torch.manual_seed(0)
    process = GaussianProcess(vocab_size=11, embed_dim=4, input=PosteriorInput())
    network = Transformer(
        d_model=16, n_layers=1, n_heads=2, max_seq_len=8, **process.network_kwargs
    )
    for p in network.parameters():
        p.data += 0.05 * torch.randn_like(p)
    return process, network


def test_teacher_is_untouched_and_outside_the_student_module():
    process, teacher = tiny_gaussian_teacher()
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    student = student_of(teacher)
    module = Distillation(
        process, student, teacher, Progressive(), torch.optim.AdamW, start_steps=8, end_steps=4
    )
    assert not any(k.startswith("teacher") for k in module.state_dict())
    optimizer = module.configure_optimizers()
    assert {id(p) for g in optimizer.param_groups for p in g["params"]} == {
        id(p) for p in student.parameters()
    }
    batch = {"tokens": torch.randint(0, 11, (4, 6))}
    for _ in range(3):
        optimizer.zero_grad()
        loss = module.method.loss(
            process,
            process.make_denoiser(student),
            process.make_denoiser(module.teacher),
            batch,
            module.steps,
        ).loss
        loss.backward()
        optimizer.step()
    for k, v in teacher.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert any(not torch.equal(v, before[k]) for k, v in student.state_dict().items())
    assert module.model_config["distillation"] == {
        "method": "progressive",
        "round": 1,
        "rounds": 1,
        "steps": 4,
        "grid": "uniform",
        "sampler": "ddim",
    }


def test_methods_refuse_the_wrong_process():
    process, teacher = tiny_gaussian_teacher()
    with pytest.raises(ValueError, match="sdtt distillation applies to masked"):
        Distillation(process, student_of(teacher), teacher, SDTT(), torch.optim.AdamW)
    with pytest.raises(ValueError, match="unknown divergence"):
        SDTT(divergence="l1")


@pytest.mark.parametrize(
    ("fixture", "module", "options"),
    [
        ("tiny_checkpoint", "distill_progressive", ["module.start_steps=8"]),
        pytest.param(
            "tiny_masked_checkpoint",
            "distill_sdtt",
            ["module.start_steps=8"],
            marks=pytest.mark.slow,  # the same path as the gaussian case, ~15 s
        ),
    ],
)
def test_cli_distils_and_the_student_loads_alone(request, tmp_path, fixture, module, options):
    """cdlm-train module=... teacher=PATH leaves the teacher file byte-identical; the student is
    an ordinary model file that cdlm-sample loads with no teacher present, at steps=4 or at its
    own recorded step count (and says so)."""
    import shutil

    from conftest import run_cli

    teacher = tmp_path / "teacher.safetensors"
    shutil.copy(request.getfixturevalue(fixture), teacher)
    before = teacher.read_bytes()
    run = tmp_path / "run"
    result = run_cli(
        "cdlm-train",
        f"module={module}",
        f"teacher={teacher}",
        "module.end_steps=4",
        "module.round_eval.num_samples=1",
        "module.round_eval.scorer=none",
        *options,
        "trainer.max_steps=2",
        "trainer.val_check_interval=2",
        "trainer.limit_val_batches=1",
        "trainer.precision=32-true",
        "data.batch_size=2",
        "logger=csv",
        f"data.path={request.getfixturevalue('tiny_corpus')}",
        f"hydra.run.dir={run}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert teacher.read_bytes() == before
    teacher.unlink()
    student = run / "model.safetensors"
    out = run_cli("cdlm-sample", f"ckpt={student}", "num_samples=1", "progress=false", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "using its steps=4" in out.stderr
    out = run_cli("cdlm-sample", f"ckpt={student}", "steps=2", "num_samples=1", cwd=tmp_path)
    assert out.returncode == 0 and "steps=2" in out.stdout
