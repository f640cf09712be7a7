"""Step distillation against closed forms: Gaussian data (whose posterior mean is exact) for the
progressive and consistency targets, a tiny vocabulary for SDTT's two-step teacher target, and
the guarantees of the module (teacher untouched, student self-contained)."""

import math

import pytest
import torch

from cdlm.denoiser import Prediction
from cdlm.distillation.callbacks import RoundEnd
from cdlm.distillation.methods import SDTT, Consistency, Progressive
from cdlm.distillation.module import Distillation, student_of
from cdlm.distillation.targets import (
    ForwardKL,
    LogProbMSE,
    ReverseKL,
    consistency_pair,
    ddim_to,
    halvings,
    progressive_target,
    sdtt_target,
)
from cdlm.networks.transformer import Transformer
from cdlm.processes.base import Corrupted
from cdlm.processes.gaussian import GaussianProcess
from cdlm.processes.inputs import PosteriorInput
from cdlm.processes.masked import MaskedProcess

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


def ddim_step(process, z, x0, t, s):
    """DDIM's deterministic update (Song et al. 2021, eq. 12, eta = 0) written out here, apart
    from the library's: z_s = alpha_s x0 + sigma_s (z_t - alpha_t x0) / sigma_t; s = 0 gives x0."""
    a_t, s_t = process.schedule.alpha(t)[:, None, None], process.schedule.sigma(t)[:, None, None]
    a_s, s_s = process.schedule.alpha(s)[:, None, None], process.schedule.sigma(s)[:, None, None]
    stepped = a_s * x0 + s_s * (z - a_t * x0) / s_t
    return torch.where((s <= 0)[:, None, None], x0, stepped)


def test_ddim_to_is_the_probability_flow_of_gaussian_data():
    """Against closed forms of the probability-flow ODE, not against DDIM: for data at one point
    MU the flow is z_s = alpha_s MU + (sigma_s / sigma_t)(z_t - alpha_t MU), which one DDIM step
    with the exact x0 = MU reaches exactly; for x0 ~ N(MU, diag(VAR)) the flow is the affine map
    between the marginals, z_s = alpha_s MU + (std_s / std_t)(z_t - alpha_t MU) with
    std_t^2 = alpha_t^2 VAR + sigma_t^2, which n DDIM steps of the exact denoiser approach at
    first order (the error halves when n doubles)."""
    process = gaussian_process()
    schedule = process.schedule
    g = torch.Generator().manual_seed(0)
    z = 2 * torch.randn(16, 2, D, dtype=torch.float64, generator=g)
    t, s = (torch.full((16,), v, dtype=torch.float64) for v in (0.9, 0.3))
    a_t, s_t, a_s, s_s = (
        f(v)[:, None, None] for v in (t, s) for f in (schedule.alpha, schedule.sigma)
    )
    point = a_s * MU + (s_s / s_t) * (z - a_t * MU)
    torch.testing.assert_close(
        ddim_to(process, z, MU.expand_as(z), t, s), point, atol=1e-12, rtol=0
    )
    torch.testing.assert_close(ddim_to(process, z, MU.expand_as(z), t, 0 * s), MU.expand_as(z))

    teacher = ExactTeacher(process)

    def ddim(n):
        x, grid = z, torch.linspace(0.9, 0.3, n + 1, dtype=torch.float64)
        for hi, lo in zip(grid[:-1], grid[1:], strict=True):
            t_hi, t_lo = hi.expand(16), lo.expand(16)
            x = ddim_to(process, x, teacher(x, t_hi).x0, t_hi, t_lo)
        return x

    std_t, std_s = ((a**2 * VAR + sg**2).sqrt() for a, sg in ((a_t, s_t), (a_s, s_s)))
    flow = a_s * MU + (std_s / std_t) * (z - a_t * MU)
    coarse, fine = (float((ddim(n) - flow).abs().max()) for n in (200, 400))
    assert fine < 1e-2 and 0.45 < fine / coarse < 0.55


@pytest.mark.parametrize("k", [1, 2, 4])
def test_progressive_target_makes_one_student_step_equal_k_teacher_steps(k):
    """One DDIM step with the target as x0 lands exactly where k teacher DDIM steps land, all
    taken with the update written out in this file (``ddim_step``)."""
    process = gaussian_process()
    teacher = ExactTeacher(process)
    g = torch.Generator().manual_seed(0)
    z = torch.randn(64, 4, D, dtype=torch.float64, generator=g)
    for i in range(1, 9):  # every interval of an 8-step student grid, the last ending at 0
        t = torch.full((64,), i / 8, dtype=torch.float64)
        t_end = torch.full((64,), (i - 1) / 8, dtype=torch.float64)
        target = progressive_target(teacher, process, z, t, t_end, k)
        walked = z
        for j in range(k):
            here, there = t - (j / k) / 8, t - ((j + 1) / k) / 8
            walked = ddim_step(process, walked, teacher(walked, here).x0, here, there)
        one = ddim_step(process, z, target, t, t_end)
        torch.testing.assert_close(one, walked, atol=1e-10, rtol=0)


@pytest.mark.parametrize("k", [2, 4])
def test_one_progressive_round_fits_a_student_that_divides_the_steps(k):
    """On Gaussian data the progressive target is affine in z_t, so an affine student per grid
    time (fitted by least squares: the minimum of the progressive loss) samples in 4 DDIM steps
    exactly what the teacher samples in 4 k (k teacher sub-steps per student step)."""
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
        target = progressive_target(teacher, process, z, t, t_end, k)
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
    torch.testing.assert_close(run(student, 4, z1), run(teacher, 4 * k, z1), atol=1e-8, rtol=0)


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
    c = Corrupted(tokens=z.clamp_max(2), x0=z.clamp_max(2), x_t=z, t=torch.ones(n), noisy=z == 3)
    target = sdtt_target(teacher, process, c, 1.0, 0.5, 2, torch.Generator().manual_seed(0))
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
    assert float(ReverseKL()(s, q)) == pytest.approx(rev, rel=1e-12)
    assert float(ForwardKL()(s, q)) == pytest.approx(fwd, rel=1e-12)
    mse = (math.log(0.5) - math.log(0.25)) ** 2 + (math.log(0.5) - math.log(0.75)) ** 2
    assert float(LogProbMSE()(s, q)) == pytest.approx(mse, rel=1e-12)


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


TINY_NET = {"d_model": 16, "n_layers": 1, "n_heads": 2, "max_seq_len": 16}


def tiny_masked_teacher(vocab_size: int = 12, mask_id: int = 11):
    torch.manual_seed(0)
    process = MaskedProcess(vocab_size=vocab_size, mask_id=mask_id)
    network = Transformer(**TINY_NET, **process.network_kwargs)
    for p in network.parameters():
        p.data += 0.05 * torch.randn_like(p)
    return process, network.eval()


def test_sdtt_loss_is_a_function_of_its_generator():
    """The validation loss is reproducible from its generator alone: the same seed gives the same
    loss whatever the global RNG holds (the mask is drawn from the generator too)."""
    process, teacher = tiny_masked_teacher()
    student = student_of(teacher).eval()
    batch = {"tokens": torch.randint(0, 11, (8, 12), generator=torch.Generator().manual_seed(5))}
    losses = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        out = SDTT().loss(
            process,
            process.make_denoiser(student),
            process.make_denoiser(teacher),
            batch,
            4,
            torch.Generator().manual_seed(0),
        )
        losses.append(float(out.loss))
    assert losses[0] == losses[1] and losses[0] > 0


class RecordRounds(RoundEnd):
    """What each round end sees, and the student step count each training batch used."""

    def __init__(self) -> None:
        self.ends, self.steps_used = [], []

    def on_round_end(self, trainer, module) -> None:
        state = {k: v.clone() for k, v in module.network.state_dict().items()}
        teacher = {k: v.clone() for k, v in module.teacher.state_dict().items()}
        self.ends.append((module.round, module.steps, trainer.global_step, state, teacher))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.steps_used.append(pl_module.steps)


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k].cpu(), b[k].cpu()), k


def tiny_trainer(tmp_path, max_steps: int, callbacks: list, checkpointing: bool = False):
    """A quiet CPU Trainer for the real multi-round runs: no validation, logger or progress."""
    import lightning as L

    return L.Trainer(
        max_steps=max_steps,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=checkpointing,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=callbacks,
    )


def per_round_distillation(process, teacher, teacher_each_round: str, method) -> Distillation:
    """Progressive distillation from 4 steps to 1 in two rounds, each with its own LR and EMA."""
    return Distillation(
        process,
        student_of(teacher),
        teacher,
        method,
        lambda p: torch.optim.AdamW(p, lr=1e-2),
        start_steps=4,
        end_steps=1,
        teacher_each_round=teacher_each_round,
        per_round=True,
    )


@pytest.mark.parametrize("kind", ["gaussian", "masked"])
def test_two_rounds_hand_the_student_to_the_teacher_and_halve_the_steps(
    tiny_corpus, tmp_path, kind, caplog
):
    """4 training steps over rounds of 2 then 1 student steps (start_steps=4): the first two
    batches train the 2-step student against the original teacher; then round 1 ends (its
    student written to round_dir and evaluated, the teacher not yet replaced), the round-1
    student becomes the teacher, and the last two batches train the 1-step student against it.
    The end of training ends round 2."""

    from cdlm.data import TextDataModule
    from cdlm.model_file import load_model

    data = TextDataModule(path=str(tiny_corpus), vocab_size=300, seq_len=8, batch_size=4)
    data.setup()
    if kind == "gaussian":
        torch.manual_seed(0)
        process = GaussianProcess(vocab_size=data.vocab_size, embed_dim=4, input=PosteriorInput())
        teacher = Transformer(**TINY_NET, **process.network_kwargs)
        method, name = Progressive(), "progressive"
        process_config = {
            "_target_": "cdlm.processes.gaussian.GaussianProcess",
            "vocab_size": data.vocab_size,
            "embed_dim": 4,
            "input": {"_target_": "cdlm.processes.inputs.PosteriorInput"},
        }
    else:
        process, teacher = tiny_masked_teacher(data.vocab_size, data.tokenizer.mask_token_id)
        method, name = SDTT(), "sdtt"
        process_config = {
            "_target_": "cdlm.processes.masked.MaskedProcess",
            "vocab_size": data.vocab_size,
            "mask_id": data.tokenizer.mask_token_id,
        }
    network_config = {"_target_": "cdlm.networks.transformer.Transformer"} | TINY_NET
    network_config |= process.network_kwargs
    model_config = {
        "process": process_config,
        "network": network_config,
        "seq_len": 8,
        "labels": [],
    }
    original = {k: v.clone() for k, v in teacher.state_dict().items()}
    evaluated = []

    def round_eval(module, steps):
        evaluated.append((module.round + 1, steps))
        return {"steps": float(steps)}

    module = Distillation(
        process,
        student_of(teacher),
        teacher,
        method,
        lambda p: torch.optim.AdamW(p, lr=1e-2),
        start_steps=4,
        end_steps=1,
        model_config=model_config,
        round_eval=round_eval,
        round_dir=str(tmp_path / "rounds"),
    )
    record = RecordRounds()
    trainer = tiny_trainer(tmp_path, 4, [record])
    with caplog.at_level("INFO"):
        trainer.fit(module, datamodule=data)

    assert record.steps_used == [2, 2, 1, 1]
    assert [(r, steps, step) for r, steps, step, _, _ in record.ends] == [(0, 2, 2), (1, 1, 4)]
    assert evaluated == [(1, 2), (2, 1)]
    (_, _, _, student1, teacher1), (_, _, _, student2, teacher2) = record.ends
    assert_same_weights(teacher1, original)  # round 1: the original teacher, untouched
    assert_same_weights(teacher2, student1)  # round 2: taught by the student of round 1
    assert_same_weights(module.teacher.state_dict(), student1)
    assert any(not torch.equal(student1[k], v) for k, v in original.items())
    assert any(not torch.equal(student2[k], v) for k, v in student1.items())
    for k, steps, student in ((1, 2, student1), (2, 1, student2)):
        saved = load_model(tmp_path / "rounds" / f"round{k}_{steps}steps.safetensors")
        assert_same_weights(saved.network.state_dict(), student)
        record_ = saved.config["distillation"]
        assert (record_["round"], record_["rounds"], record_["steps"]) == (k, 2, steps)
    started = [r.getMessage() for r in caplog.records if "distillation round" in r.getMessage()]
    assert started == [
        f"distillation round 1/2 ({name}): teacher 4 steps -> student 2 steps",
        f"distillation round 2/2 ({name}): teacher 2 steps -> student 1 steps",
    ]


@pytest.mark.parametrize("module_kind", ["diffusion", "distillation"])
def test_both_modules_refuse_a_wallclock_schedule_on_several_processes(module_kind):
    """Each process would read its own clock: the schedules, then the replicas, would drift. The
    training module and the distillation module share the optimizer set-up, guard included."""
    from types import SimpleNamespace

    from cdlm.training.lr_schedules import wallclock_cosine
    from cdlm.training.module import DiffusionLM

    process, teacher = tiny_gaussian_teacher()
    schedule = {"optimizer": torch.optim.AdamW, "lr_scheduler": lambda o: wallclock_cosine(o, 60)}
    if module_kind == "diffusion":
        module = DiffusionLM(process, teacher, **schedule)
    else:
        module = Distillation(process, student_of(teacher), teacher, Progressive(), **schedule)
    module.trainer = SimpleNamespace(world_size=1)
    assert module.configure_optimizers()["lr_scheduler"]["interval"] == "step"
    module.trainer = SimpleNamespace(world_size=2)
    with pytest.raises(ValueError, match="wallclock_cosine is for single-process runs"):
        module.configure_optimizers()


def test_methods_refuse_the_wrong_process():
    process, teacher = tiny_gaussian_teacher()
    with pytest.raises(ValueError, match="sdtt distillation applies to masked, block models"):
        Distillation(process, student_of(teacher), teacher, SDTT(), torch.optim.AdamW)
    with pytest.raises(ValueError, match="unknown divergence"):
        SDTT(divergence="l1")


@pytest.fixture(scope="module")
def tiny_block_checkpoint(tmp_path_factory, tiny_corpus):
    from conftest import train_tiny

    return train_tiny(tmp_path_factory, tiny_corpus, "process=block")


@pytest.mark.parametrize(
    ("fixture", "module", "options", "note"),
    [
        ("tiny_checkpoint", "distill_progressive", ["module.start_steps=16"], "sampler=ddim;"),
        pytest.param(
            "tiny_masked_checkpoint",
            "distill_sdtt",
            ["module.start_steps=16"],
            "sampler=ancestral;",
            marks=pytest.mark.slow,  # the same path as the gaussian case, ~15 s
        ),
        pytest.param(
            "tiny_block_checkpoint",
            "distill_sdtt",
            ["module.start_steps=16"],
            "sampler=block, sampler.steps_per_block=4;",
            marks=pytest.mark.slow,  # SDTT within blocks, the student on the block sampler
        ),
    ],
)
def test_cli_distils_and_the_student_loads_alone(request, tmp_path, fixture, module, options, note):
    """cdlm-train module=... teacher=PATH runs the module's rounds with the default callbacks (2
    steps over rounds of 8 then 4 student steps, each round's student kept) and leaves the
    teacher file byte-identical; the student is an ordinary model file that cdlm-sample loads
    with no teacher present, at its own recorded step count and sampler (and says so; a block
    student's steps are per block) or at steps=2."""
    import shutil

    from conftest import TINY_DISTIL, run_cli, run_main

    teacher = tmp_path / "teacher.safetensors"
    shutil.copy(request.getfixturevalue(fixture), teacher)
    before = teacher.read_bytes()
    run = tmp_path / "run"
    result = run_cli(  # a real command: the round lines come from Lightning's logger
        "cdlm-train",
        f"module={module}",
        f"teacher={teacher}",
        "module.end_steps=4",
        "module.round_eval.num_samples=1",
        "module.round_eval.scorer=none",
        f"module.round_dir={tmp_path / 'rounds'}",
        *options,
        *TINY_DISTIL,
        f"data.path={request.getfixturevalue('tiny_corpus')}",
        f"hydra.run.dir={run}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "distillation round 2/2" in result.stderr and "round 2 (4 steps)" in result.stderr
    rounds = sorted(p.name for p in (tmp_path / "rounds").iterdir())
    assert rounds == ["round1_8steps.safetensors", "round2_4steps.safetensors"]
    assert teacher.read_bytes() == before
    teacher.unlink()
    student = run / "model.safetensors"
    out = run_main(
        "cdlm-sample", f"ckpt={student}", "num_samples=1", "progress=false", cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"using its steps=4, {note}" in out.stderr
    out = run_main("cdlm-sample", f"ckpt={student}", "steps=2", "num_samples=1", cwd=tmp_path)
    assert out.returncode == 0 and "steps=2" in out.stdout


@pytest.mark.parametrize("teacher_each_round", ["original", "previous"])
def test_per_round_rounds_pass_on_the_ema_and_choose_the_teacher(
    tiny_corpus, tmp_path, teacher_each_round
):
    """Two real rounds with ``per_round``: round 1's student (as saved and scored) is its EMA;
    round 2 starts from it with a fresh optimizer state and a restarted LR warmup; its teacher
    is the original one or round 1's student, as configured (k = 4 teacher sub-steps)."""

    from cdlm.data import TextDataModule
    from cdlm.training.ema import EMA

    data = TextDataModule(path=str(tiny_corpus), vocab_size=300, seq_len=8, batch_size=4)
    data.setup()
    torch.manual_seed(0)
    process = GaussianProcess(vocab_size=data.vocab_size, embed_dim=4, input=PosteriorInput())
    teacher = Transformer(**TINY_NET, **process.network_kwargs)
    original = {k: v.clone() for k, v in teacher.state_dict().items()}
    module = per_round_distillation(
        process, teacher, teacher_each_round, Progressive(teacher_steps_per_step=4)
    )
    ema = EMA(decay=0.9)
    seen = []

    class Watch(RoundEnd):
        def on_round_end(self, trainer, pl_module):
            average = ema._average_model.module.network.state_dict()
            student = {k: v.clone() for k, v in pl_module.network.state_dict().items()}
            assert_same_weights(student, average)  # the round's student is its EMA
            seen.append(student)

        def on_before_backward(self, trainer, pl_module, loss):  # after Rounds, before the step
            opt = trainer.optimizers[0]
            state = {k: v.clone() for k, v in pl_module.network.state_dict().items()}
            seen.append((pl_module.round, None, len(opt.state), state))

    tiny_trainer(tmp_path, 6, [ema, Watch()]).fit(module, datamodule=data)
    batches = [s for s in seen if isinstance(s, tuple)]
    students = [s for s in seen if isinstance(s, dict)]
    assert [b[0] for b in batches] == [0, 0, 0, 1, 1, 1]
    first_of_round_2 = batches[3]
    assert first_of_round_2[2] == 0 and batches[2][2] > 0  # the optimizer state restarted
    assert_same_weights(first_of_round_2[3], students[0])  # round 2 starts from round 1's EMA
    expected = original if teacher_each_round == "original" else students[0]
    assert_same_weights(module.teacher.state_dict(), expected)
    assert len(students) == 2


@pytest.mark.parametrize("teacher_each_round", ["original", "previous"])
def test_a_run_resumed_in_round_2_keeps_its_round_and_teacher(
    tiny_corpus, tmp_path, teacher_each_round
):
    """Interrupted after 4 of 6 steps (in round 2 of 2), a fresh module resumed from the
    Lightning checkpoint runs the last two steps in round 2, with round 2's teacher (the
    original or round 1's student) restored from the checkpoint, not the one it was built with."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from cdlm.data import TextDataModule

    data = TextDataModule(path=str(tiny_corpus), vocab_size=300, seq_len=8, batch_size=4)
    data.setup()
    torch.manual_seed(0)
    process = GaussianProcess(vocab_size=data.vocab_size, embed_dim=4, input=PosteriorInput())

    def build(seed):
        torch.manual_seed(seed)
        teacher = Transformer(**TINY_NET, **process.network_kwargs)
        return per_round_distillation(process, teacher, teacher_each_round, Progressive())

    rounds = []

    class Watch(RoundEnd):
        def on_before_backward(self, trainer, pl_module, loss):
            rounds.append((trainer.global_step, pl_module.round))

    def fit(module, callbacks, ckpt_path=None):
        trainer = tiny_trainer(tmp_path, 6, [Watch(), *callbacks], checkpointing=True)
        trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)

    keep = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=4, save_top_k=-1)
    first = build(0)
    fit(first, [keep])
    (path,) = (tmp_path / "ckpt").glob("*step=4.ckpt")
    saved = torch.load(path, weights_only=True)
    round_2_teacher = saved["distillation"]["teacher"]
    rounds.clear()
    resumed = build(1)  # other weights, so a teacher not restored would show
    fit(resumed, [], ckpt_path=path)
    assert saved["distillation"]["round"] == 1 and rounds == [(4, 1), (5, 1)]
    assert_same_weights(resumed.teacher.state_dict(), round_2_teacher)
    if teacher_each_round == "original":
        assert_same_weights(round_2_teacher, first.teacher.state_dict())


def test_per_round_lr_warms_up_and_decays_within_each_round(monkeypatch):
    import cdlm.distillation.module as module_file

    process, teacher = tiny_gaussian_teacher()
    module = Distillation(
        process, student_of(teacher), teacher, Progressive(), torch.optim.AdamW,
        start_steps=8, end_steps=2, per_round=True, round_warmup=0.1, round_min_lr=0.1,
    )  # fmt: skip
    module._trainer = object()
    factors = {}
    for progress in (0.01, 0.3, 0.49, 0.51, 0.99):
        monkeypatch.setattr(module_file, "budget_progress", lambda trainer, p=progress: p)
        module.round = int(progress * 2)
        factors[progress] = module.round_lr_factor()
    assert factors[0.01] == pytest.approx(0.2)  # 2% into round 1, warmup 10%
    assert factors[0.3] > factors[0.49] == pytest.approx(0.1, abs=0.01)  # cosine to 0.1
    assert factors[0.51] == pytest.approx(0.2)  # round 2 warms up again
    assert factors[0.99] == pytest.approx(0.1, abs=0.01)
