"""Discrete Consistency Distillation (module=distill_dcd) against the Duo reference, in float64.

Reference: github.com/s-sahoo/duo at commit 7c9b498f5b717de064d6fad7e2509c866e6cb620
(``algo.py``: ``Distillation._sample_trajectory`` and ``Distillation.nll``, ``loss_type``
kl-bwd / kl-fwd). The reference draws one dense Gaussian over the V one-hot dims and takes two
argmaxes; its formulas are re-derived below in plain torch, in its own variables (gamma =
-logSNR), and compared with cdlm's O(B L) draw and the DCD loss.
"""

from __future__ import annotations

import math

import pytest
import torch

from cdlm.denoiser import Prediction
from cdlm.distillation.methods import DCD
from cdlm.distillation.targets import ForwardKL, ReverseKL
from cdlm.processes.duality import argmax_pair, draw_runner, logsnr_of_alpha, uniform_alpha
from cdlm.processes.uniform import UniformProcess

F64 = torch.float64


def reference_trajectory(x0, gamma_t, gamma_s, epsilon, vocab):
    """``Distillation._sample_trajectory`` then the argmaxes of ``nll``, given its epsilon."""
    e = torch.nn.functional.one_hot(x0, vocab).to(F64)
    gamma_t, gamma_s = gamma_t[:, None, None], gamma_s[:, None, None]
    alpha_t, sigma_t = torch.sigmoid(-gamma_t).sqrt(), torch.sigmoid(gamma_t).sqrt()
    alpha_s, sigma_s = torch.sigmoid(-gamma_s).sqrt(), torch.sigmoid(gamma_s).sqrt()
    xt = alpha_t * e + sigma_t * epsilon
    xs = alpha_s * e + sigma_s * epsilon
    return xt.argmax(-1), xs.argmax(-1)


def reference_loss(log_student, log_teacher, loss_type):
    """``Distillation.nll``'s per-token loss in float64 (``loss_precision``), averaged over
    tokens as the reference's training loss is."""
    if loss_type == "kl-fwd":
        per = (log_teacher.exp() * (log_teacher - log_student)).sum(-1)
    else:
        per = (log_student.exp() * (log_student - log_teacher)).sum(-1)
    return per.mean()


def runner_of(epsilon, x0):
    """(own, runner, runner_id) read off a dense epsilon (B, L, V)."""
    own = epsilon.gather(-1, x0[..., None]).squeeze(-1)
    others = epsilon.scatter(-1, x0[..., None], -math.inf)
    runner, runner_id = others.max(-1)
    return own, runner, runner_id


@pytest.mark.parametrize("vocab", [2, 7, 300])
def test_argmax_pair_is_the_reference_trajectory(vocab):
    g = torch.Generator().manual_seed(vocab)
    b, length = 64, 6
    x0 = torch.randint(0, vocab, (b, length), generator=g)
    epsilon = torch.randn(b, length, vocab, generator=g, dtype=F64)
    # the reference's gamma range is [-4, -1]; a wider one reaches both ends of the path
    gamma_t = torch.empty(b, dtype=F64).uniform_(-6.0, 4.0, generator=g)
    gamma_s = gamma_t - torch.rand(b, generator=g, dtype=F64) * 3
    want_t, want_s = reference_trajectory(x0, gamma_t, gamma_s, epsilon, vocab)
    mu_t, mu_s = (torch.exp(-0.5 * v)[:, None] for v in (gamma_t, gamma_s))
    got_t, got_s = argmax_pair(x0, mu_t, mu_s, *runner_of(epsilon, x0))
    assert torch.equal(got_t, want_t) and torch.equal(got_s, want_s)
    assert bool((want_t != want_s).any())  # the two levels do differ somewhere


class Spy:
    """A denoiser returning fixed log-probabilities and recording what it was called with."""

    def __init__(self, logp):
        self.logp, self.calls = logp, []

    def __call__(self, z, t, self_cond=None, **kw):
        self.calls.append((z.clone(), t.clone()))
        return Prediction(logits=self.logp.clone())


@pytest.mark.parametrize(
    ("divergence", "loss_type"), [(ReverseKL(), "kl-bwd"), (ForwardKL(), "kl-fwd")]
)
def test_dcd_loss_is_the_reference_divergence_on_its_trajectory(divergence, loss_type):
    """The student reads (x_t, t), the teacher (x_s, s = t - 1/(2 steps)) from one trajectory
    (the process's, replayed from the same generator), and the loss is the reference's
    per-token divergence averaged over the tokens."""
    vocab, b, length, steps = 11, 16, 8, 2
    process = UniformProcess(vocab_size=vocab).train()
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (b, length), generator=g)
    log_student = torch.randn(b, length, vocab, generator=g, dtype=F64).log_softmax(-1)
    log_teacher = torch.randn(b, length, vocab, generator=g, dtype=F64).log_softmax(-1)
    student, teacher = Spy(log_student.float()), Spy(log_teacher.float())
    out = DCD(divergence).loss(
        process, student, teacher, {"tokens": tokens}, steps, torch.Generator().manual_seed(1)
    )
    want = reference_loss(log_student.float().double(), log_teacher.float().double(), loss_type)
    assert out.loss.dtype == torch.float32
    assert float(out.loss) == pytest.approx(float(want), rel=1e-6)

    replay = torch.Generator().manual_seed(1)
    t = (process.sample_t(b, replay) + 1 / (2 * steps)).clamp(max=1.0)
    s = t - 1 / (2 * steps)
    x_t, x_s = process.trajectory(tokens, t, s, replay)
    (z_student, t_student), (z_teacher, t_teacher) = student.calls[0], teacher.calls[0]
    assert torch.equal(t_student, t) and torch.allclose(t_teacher, s)
    assert torch.equal(z_student, x_t) and torch.equal(z_teacher, x_s)
    assert bool((x_t != x_s).any())


def test_cheap_draw_has_the_dense_joint_law_and_the_process_marginals():
    """V = 5: the O(B L) draw gives the same joint law of (x_t == x, x_s == x) as a dense
    Gaussian over the one-hots at the same logsnrs (within 5 standard errors), x_t's marginal
    is the process's keep(t) + (1 - keep(t)) / V, the other tokens are equally likely, and
    where both leave x they agree (one runner)."""
    vocab, n = 5, 200_000
    process = UniformProcess(vocab_size=vocab)
    t, s = torch.full((n,), 0.7), torch.full((n,), 0.4)
    tokens = torch.randint(0, vocab, (n, 1), generator=torch.Generator().manual_seed(0))
    x_t, x_s = process.trajectory(tokens, t, s, torch.Generator().manual_seed(1))

    mu_t, mu_s = (torch.exp(0.5 * logsnr_of_alpha(process.keep(v[:1]), vocab)) for v in (t, s))
    eps = torch.randn(n, 1, vocab, generator=torch.Generator().manual_seed(2), dtype=F64)
    e = torch.nn.functional.one_hot(tokens, vocab).to(F64)
    d_t, d_s = ((mu * e + eps).argmax(-1) for mu in (mu_t, mu_s))

    def cells(a, b):
        kept_a, kept_b = a == tokens, b == tokens
        return torch.stack([(kept_a & kept_b), (~kept_a & kept_b), (~kept_a & ~kept_b)]).double()

    cheap, dense = cells(x_t, x_s).mean((1, 2)), cells(d_t, d_s).mean((1, 2))
    se = torch.sqrt(2 * dense * (1 - dense) / n)
    assert bool(((cheap - dense).abs() < 5 * se + 1e-12).all()), (cheap, dense)
    assert bool((x_t == tokens).le(x_s == tokens).all())  # s < t: kept at t, kept at s
    leave = (x_t != tokens) & (x_s != tokens)
    assert torch.equal(x_t[leave], x_s[leave])

    for x, v in ((x_t, t), (x_s, s)):
        keep = float(process.keep(v[:1]))
        p = keep + (1 - keep) / vocab
        hit = float((x == tokens).double().mean())
        assert abs(hit - p) < 5 * math.sqrt(p * (1 - p) / n)
    shift = ((x_t - tokens) % vocab)[x_t != tokens]  # which other token, relative to x
    freq = torch.bincount(shift, minlength=vocab)[1:].double() / shift.numel()
    q = 1 / (vocab - 1)
    assert bool(((freq - q).abs() < 5 * math.sqrt(q * (1 - q) / shift.numel())).all())


@pytest.mark.parametrize("vocab", [2, 30, 8192])
def test_logsnr_of_alpha_inverts_uniform_alpha(vocab):
    logsnr = torch.linspace(-8.0, 3.0, 23, dtype=F64)
    back = logsnr_of_alpha(uniform_alpha(logsnr, vocab), vocab)
    assert torch.allclose(back, logsnr, rtol=0, atol=1e-8)


def test_draw_runner_is_a_function_of_its_generator():
    tokens = torch.randint(0, 9, (3, 4), generator=torch.Generator().manual_seed(0))
    a, b = (draw_runner(tokens, 9, torch.Generator().manual_seed(5)) for _ in range(2))
    assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
    assert bool((a[2] != tokens).all()) and int(a[2].max()) < 9


def test_cli_distils_a_uniform_teacher_and_the_student_samples(
    tmp_path_factory, tiny_corpus, tmp_path
):
    """cdlm-train process=uniform module=distill_dcd teacher=PATH runs one round (teacher at 8
    steps, student at 4) and leaves a student that cdlm-sample draws from with duo_ancestral."""
    from conftest import TINY_DISTIL, run_main, train_tiny

    teacher = train_tiny(tmp_path_factory, tiny_corpus, "process=uniform")
    run = tmp_path / "run"
    result = run_main(
        "cdlm-train",
        "process=uniform",
        "module=distill_dcd",
        f"teacher={teacher}",
        "module.start_steps=8",
        "module.end_steps=4",
        "module.round_eval=null",
        *TINY_DISTIL,
        "+trainer.enable_progress_bar=false",
        f"data.path={tiny_corpus}",
        f"hydra.run.dir={run}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    student = run / "model.safetensors"
    out = run_main(
        "cdlm-sample", f"ckpt={student}", "steps=4", "num_samples=1", "progress=false", cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "duo_ancestral" in out.stdout + out.stderr
