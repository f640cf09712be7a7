"""Training-time levers: time samplers, the no-context diagnostic, the readout skip, shifted
masked prediction and AR initialisation with attention annealing."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from cdlm.evaluation.levels import level_metrics
from cdlm.networks.transformer import Transformer
from cdlm.processes import AutoregressiveProcess, GaussianProcess, MaskedProcess
from cdlm.processes.masked import MaskedDenoiser
from cdlm.processes.objectives import CrossEntropy
from cdlm.time_samplers import Curriculum, Stratified, Warped
from cdlm.training.phases import Phases

CPU = torch.device("cpu")


def test_stratified_draws_one_time_per_stratum():
    torch.manual_seed(0)
    t = Stratified()(8, CPU)
    assert sorted((t * 8).floor().long().tolist()) == list(range(8))


def test_curriculum_widens_the_range_to_one_over_the_ramp():
    torch.manual_seed(0)
    c = Curriculum(start=0.15, ramp=0.5)
    assert c(256, CPU).max() <= 0.15
    for _ in range(9):
        c(4, CPU)
    assert c.high() == 0.15  # drawing advances nothing: only the budget share moves the ramp
    c.set_progress(0.25)  # halfway through the ramp
    assert c.high() == pytest.approx(0.575) and c(256, CPU).max() <= 0.575
    c.set_progress(0.5)
    assert c.high() == 1.0 and c(256, CPU).max() > 0.9
    c.set_progress(0.9)
    assert c.high() == 1.0  # past the ramp: the full range
    # Progress is training state, not model state: the Phases callback sets it from the
    # trainer's place in the budget before every batch, so a resumed run continues the ramp.
    assert "progress" not in c.state_dict()
    resumed = MaskedProcess(10, mask_id=9, time_sampler=Curriculum(start=0.15, ramp=0.5))
    trainer = SimpleNamespace(max_steps=100, global_step=25, callbacks=[])
    module = SimpleNamespace(process=resumed, network=None)
    Phases().on_train_batch_start(trainer, module, None, 0)  # no AR phase, no annealing
    assert resumed.time_sampler.high() == pytest.approx(0.575)
    draw = [c(16, CPU, torch.Generator().manual_seed(3)) for _ in range(2)]
    torch.testing.assert_close(draw[0], draw[1])  # the generator alone fixes the draw
    assert Curriculum(ramp=0.0).high() == 1.0
    with pytest.raises(ValueError, match="share of the budget"):
        Curriculum(ramp=200)


def test_warped_concentrates_where_the_loss_rises():
    torch.manual_seed(0)
    w = Warped(bins=10, momentum=1.0, uniform=0.1)
    assert torch.allclose(w.bin_density(), torch.full((10,), 0.1))  # nothing seen yet
    t = (torch.arange(10) + 0.5) / 10
    loss = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, 5.0, 5.0, 4.0, 5.0, 5.0])  # rises in bins 4-5
    w.observe(t, loss)
    d = w.bin_density()
    assert d.sum().item() == pytest.approx(1.0)
    # Increments of the running max: 1 at bin 4, 4 at bin 5, none elsewhere (the dip at 7 too).
    expected = 0.1 * 0.1 + 0.9 * torch.tensor([0, 0, 0, 0, 0.2, 0.8, 0, 0, 0, 0])
    torch.testing.assert_close(d, expected.float())
    draws = w(20_000, CPU)
    share = ((draws >= 0.4) & (draws < 0.6)).float().mean().item()
    assert share == pytest.approx(0.9 + 0.1 * 0.2, abs=0.01)
    assert draws.min() >= 0 and draws.max() <= 1


def test_validation_bound_ignores_the_training_time_sampler():
    """In eval mode the masked loss is the stratified-uniform ELBO whatever the curriculum."""
    torch.manual_seed(0)
    proc = MaskedProcess(10, mask_id=9, time_sampler=Curriculum(start=0.05, ramp=1.0))
    seen = []

    def denoiser(z, t):
        seen.append(t.clone())
        return MaskedDenoiser(lambda x, tt, label=None: torch.zeros(*x.shape, 10), 9)(z, t)

    batch = {"tokens": torch.randint(0, 9, (64, 12))}
    proc.train().loss(denoiser, batch)
    assert seen[-1].max() <= 0.05 + 1e-3
    proc.eval().loss(denoiser, batch)
    assert seen[-1].max() > 0.9


def test_masked_no_context_baseline_is_the_unigram_prior():
    proc = MaskedProcess(5, mask_id=4).eval()
    tokens = torch.tensor([[0, 1, 1, 2, 3, 3, 3, 0]])
    log_prior = torch.tensor([0.1, 0.2, 0.3, 0.3, 0.1]).log()

    def uniform(z, t):
        return MaskedDenoiser(lambda x, tt, label=None: torch.zeros(*x.shape, 5), 4)(z, t)

    ev = proc.evaluate_at(uniform, tokens, 0.999, torch.Generator().manual_seed(0))
    m = level_metrics(ev, log_prior)
    masked = tokens[0]  # at t ~ 1 every position is masked
    expected = -(torch.tensor([0.1, 0.2, 0.3, 0.3]).log()[masked]).mean()
    assert m.baseline_ce.item() == pytest.approx(expected.item(), rel=1e-5)
    assert m.ce.item() == pytest.approx(math.log(4), rel=1e-5)  # uniform over the 4 real tokens


def test_readout_skip_makes_a_zero_network_the_no_context_readout():
    torch.manual_seed(0)
    proc = GaussianProcess(50, embed_dim=8, objective=CrossEntropy(readout_skip=True)).eval()
    net = Transformer(**proc.network_kwargs, d_model=16, n_layers=1, n_heads=2, max_seq_len=16)
    torch.nn.init.zeros_(net.out_proj.weight)
    torch.nn.init.zeros_(net.out_proj.bias)
    tokens = torch.randint(0, 50, (4, 16))
    uniform = torch.full((50,), -math.log(50))

    def metrics(t):
        ev = proc.evaluate_at(proc.make_denoiser(net), tokens, t, torch.Generator())
        return level_metrics(ev, uniform)

    for t in (0.3, 0.6, 0.9):
        m = metrics(t)
        assert m.ce.item() == pytest.approx(m.baseline_ce.item(), rel=1e-4)
        assert m.acc.item() == pytest.approx(m.baseline_acc.item())
    assert m.baseline_acc < 0.5 < metrics(0.1).acc  # low noise: the own embedding gives it away


def test_shifted_masked_prediction_reads_the_previous_output():
    calls = []

    def network(x, t, label=None):
        calls.append(x.clone())
        return torch.nn.functional.one_hot(x, 6).float() * 10  # echoes its input

    z = torch.tensor([[2, 5, 3]])  # 5 = [MASK]
    logp = MaskedDenoiser(network, mask_id=5, shift_from=0)(z, torch.zeros(1)).logits
    assert calls[0].tolist() == [[0, 2, 5, 3]]
    assert logp[0, 1].argmax().item() == 2  # position 1 predicted from the output at 0 (token 2)


def test_ar_checkpoint_in_a_shifted_masked_model_starts_as_the_ar_model():
    """With future visibility 0 the bidirectional network is exactly causal, so a masked model
    initialised from an AR network reproduces its next-token logits on clean input."""
    torch.manual_seed(0)
    ar = AutoregressiveProcess(12, bos_id=1)
    masked = MaskedProcess(12, mask_id=11, eos_id=1, shift=True)
    ar_net = Transformer(**ar.network_kwargs, d_model=16, n_layers=2, n_heads=2, max_seq_len=9)
    for p in ar_net.parameters():
        torch.nn.init.normal_(p, std=0.3)
    net = Transformer(**masked.network_kwargs, d_model=16, n_layers=2, n_heads=2, max_seq_len=9)
    net.load_state_dict(ar_net.state_dict())
    tokens = torch.randint(0, 11, (3, 8))
    expected = ar.make_denoiser(ar_net)(ar.make_denoiser(ar_net).shift(tokens)).logits
    net.train()
    net.future_visibility = 0.0
    bos = torch.full((3, 1), 1)
    got = net(torch.cat([bos, tokens], 1), torch.zeros(3))[:, :-1]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    net.future_visibility = 1.0  # and full attention sees the future
    assert not torch.allclose(net(torch.cat([bos, tokens], 1), torch.zeros(3))[:, :-1], expected)


def test_ar_phase_then_annealed_attention_then_masked_objective():
    """The Phases callback drives the schedule from the budget share: with 8 steps, ar=0.25 and
    anneal=0.5, batches 0-1 are AR, attention opens over batches 2-6 (visibility
    (p - 0.25) / 0.5 at p = step / 8), then the masked objective with full attention."""
    torch.manual_seed(0)
    proc = MaskedProcess(12, mask_id=11, eos_id=1, shift=True).train()
    net = Transformer(**proc.network_kwargs, d_model=16, n_layers=1, n_heads=2, max_seq_len=9)
    den = proc.make_denoiser(net)
    tokens = torch.randint(0, 11, (3, 8))
    batch = {"tokens": tokens}
    phases, module = Phases(ar=0.25, anneal=0.5), SimpleNamespace(process=proc, network=net)
    trainer = SimpleNamespace(max_steps=8, global_step=0, callbacks=[])
    phases.setup(trainer, module, "fit")
    seen = []
    for step in range(8):
        trainer.global_step = step
        phases.on_train_batch_start(trainer, module, batch, step)
        out = proc.loss(den, batch)
        seen.append((sorted(out.metrics), net.future_visibility))
    assert seen[0] == (["ar_bits_per_token"], 0.0) and seen[1][0] == ["ar_bits_per_token"]
    assert [v for _, v in seen[2:]] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]
    assert all(m == ["bits_per_token"] for m, _ in seen[2:])
    phases.on_train_end(trainer, module)  # the trained model is left a diffusion model
    assert not proc.ar_phase and net.future_visibility == 1.0
    # The AR phase loss is the next-token NLL of the same weights as a causal AR network (with
    # no probability on [MASK], which the masked model never predicts).
    ar = AutoregressiveProcess(12, bos_id=1)
    ar_den = ar.make_denoiser(net)
    net.causal = True
    logits = ar_den(ar_den.shift(tokens)).logits
    net.causal = False
    logits[..., 11] = -math.inf
    expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
    proc.ar_phase, net.future_visibility = True, 0.0  # what Phases sets in the AR phase
    torch.testing.assert_close(proc.loss(den, batch).loss, expected, atol=1e-5, rtol=1e-5)
    assert proc.ar_phase and net.future_visibility == 0.0  # the loss advanced nothing
    # an AR phase needs the next-token layout: refused before training, and by the loss itself
    unshifted = MaskedProcess(12, mask_id=11, eos_id=1)
    plain = SimpleNamespace(process=unshifted, network=net)
    with pytest.raises(ValueError, match="next-token layout"):
        Phases(ar=0.25).setup(trainer, plain, "fit")
    Phases(anneal=0.25).setup(trainer, plain, "fit")  # annealing alone needs no shift
    unshifted.train().ar_phase = True
    with pytest.raises(ValueError, match="shift=true"):
        unshifted.loss(unshifted.make_denoiser(net), batch)
    with pytest.raises(ValueError, match="trainer.max_steps or trainer.max_time"):
        phases.setup(SimpleNamespace(max_steps=-1, global_step=0, callbacks=[]), module, "fit")
    with pytest.raises(ValueError, match="shares of the budget"):
        Phases(ar=0.8, anneal=0.5)


def test_phases_that_leave_no_diffusion_training_are_refused():
    """Phases are shares of the budget, so any step budget fits the default recipe; shares that
    add up past the whole budget (or an AR phase that is all of it) are refused at config time,
    with one line, before any work. In process: each CLI start costs seconds."""
    from cdlm.cli.train import validate
    from cdlm.configs import compose_checked
    from cdlm.validation import UsageError

    validate(compose_checked("train", ["process=masked", "trainer.max_steps=30"]))
    for shares, needle in (
        (["phases.ar=0.8", "phases.anneal=0.5"], "shares of the budget"),
        (["phases.ar=1.0"], r"phases\.ar.*1\.0"),
    ):
        overrides = ["process=masked", "trainer.max_steps=100", *shares]
        with pytest.raises(UsageError, match=needle) as err:
            validate(compose_checked("train", overrides), overrides)
        assert "\n" not in str(err.value)


def test_lr_schedules_refuse_a_missing_budget():
    from cdlm.training.lr_schedules import wallclock_cosine, warmup_cosine

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match="wallclock_cosine"):
        warmup_cosine(opt, warmup_steps=10, total_steps=-1)
    with pytest.raises(ValueError, match="trainer.max_time"):
        wallclock_cosine(opt, None)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        wallclock_cosine(opt, 60.0, warmup=1.0)


def test_token_noise_gives_each_token_its_own_level_in_training_only():
    torch.manual_seed(0)
    proc = GaussianProcess(
        30, embed_dim=8, objective=CrossEntropy(readout_skip=True), token_noise=1.0
    )
    x0 = torch.randn(2, 5, 8)
    t = torch.tensor([[0.0, 0.5, 1.0, 0.5, 0.0], [0.2, 0.2, 0.2, 0.2, 0.2]])
    noise = torch.randn(2, 5, 8)
    out = proc.noised(x0, t, noise)
    a, s = proc.schedule.alpha(t[0, 2]), proc.schedule.sigma(t[0, 2])
    torch.testing.assert_close(out[0, 2], a * x0[0, 2] + s * noise[0, 2])
    torch.testing.assert_close(out[1], proc.noised(x0[1:], t[1, :1], noise[1:])[0])
    # corrupt embeds the tokens and noises them the same way, handing back the noise it drew
    ids = torch.randint(0, 30, (2, 5))
    c = proc.corrupt(ids, t, torch.Generator().manual_seed(0))
    torch.testing.assert_close(c.x0, proc.embedding(ids))
    torch.testing.assert_close(c.x_t, proc.noised(c.x0, t, c.noise))
    assert c.noisy.all() and c.t is t
    net = Transformer(**proc.network_kwargs, d_model=16, n_layers=1, n_heads=2, max_seq_len=8)
    levels = []
    real = proc.corrupt
    proc.corrupt = lambda tokens, t, generator=None: levels.append(t) or real(tokens, t, generator)
    batch = {"tokens": torch.randint(0, 30, (64, 8))}
    proc.train().loss(proc.make_denoiser(net), batch)
    assert levels[-1].shape == (64, 8) and (levels[-1].std(-1) > 0.1).all()
    proc.eval().loss(proc.make_denoiser(net), batch)
    assert levels[-1].shape == (64,)  # validation: one level per sequence
    with pytest.raises(ValueError, match="readout_skip"):
        GaussianProcess(30, token_noise=0.5)


def test_warped_grid_spends_steps_where_the_learned_loss_rises():
    from cdlm.samplers.grids import make_grid

    warped = Warped(bins=10, uniform=0.0)
    warped.observe(torch.linspace(0.05, 0.95, 10), torch.tensor([0.0] * 8 + [1.0, 2.0]))
    grid = make_grid("warped", 8, None, "cpu", warped.quantile)
    assert grid[0] == 1.0 and grid[-1] == 0.0 and (grid.diff() < 0).all()
    assert (grid[1:-1] > 0.7).all()  # every inner step in the last bins, where the loss rises
    with pytest.raises(ValueError, match="time_sampler=warped"):
        make_grid("warped", 8)
