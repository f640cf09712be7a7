import math

import pytest
import torch
import torch.nn.functional as F

from cdlm.denoiser import Prediction
from cdlm.networks.embedding import NormalizedEmbedding
from cdlm.networks.transformer import Transformer
from cdlm.processes.gaussian import GaussianProcess
from cdlm.processes.inputs import VectorInput
from cdlm.processes.objectives import X0MSE, CrossEntropy
from cdlm.schedules import CosineSchedule
from cdlm.time_samplers import TimeSampler, stratified_times


def test_embeddings_have_fixed_norm():
    emb = NormalizedEmbedding(50, 16, scale=2.0)
    norms = emb.table().norm(dim=-1)
    torch.testing.assert_close(norms, torch.full((50,), 2.0 * 4.0))


def test_nearest_embedding_recovers_tokens():
    emb = NormalizedEmbedding(40, 16)
    tokens = torch.randint(0, 40, (3, 7))
    assert torch.equal(emb.nearest(emb(tokens)), tokens)


def test_corrupt_denoise_round_trip_float64():
    process = GaussianProcess(vocab_size=30, embed_dim=8).double()
    tokens = torch.randint(0, 30, (4, 5))
    x0 = process.embedding(tokens)
    noise = torch.randn_like(x0)
    t = torch.tensor([0.0, 0.3, 0.7, 1.0], dtype=torch.float64)
    x_t = process.noised(x0, t, noise)
    alpha, sigma = process.schedule.alpha(t), process.schedule.sigma(t)
    recovered = (x_t - sigma[:, None, None] * noise) / alpha[:, None, None]
    torch.testing.assert_close(recovered, x0, atol=1e-9, rtol=1e-9)
    # and the noise is recovered from x_t given x0
    eps = (x_t - alpha[:, None, None] * x0) / sigma[:, None, None]
    torch.testing.assert_close(eps, noise, atol=1e-9, rtol=1e-9)
    # corrupt(tokens) embeds, then noises with the draw it returns: the same round trip
    c = process.corrupt(tokens, t, torch.Generator().manual_seed(0))
    assert torch.equal(c.tokens, tokens) and torch.equal(c.t, t) and c.noisy.all()
    assert c.x_t.dtype == c.noise.dtype == torch.float64
    torch.testing.assert_close(c.x0, x0, atol=0, rtol=0)
    torch.testing.assert_close(c.x_t, process.noised(x0, t, c.noise), atol=0, rtol=0)
    recovered = (c.x_t - sigma[:, None, None] * c.noise) / alpha[:, None, None]
    torch.testing.assert_close(recovered, x0, atol=1e-9, rtol=1e-9)


def test_stratified_times_cover_each_stratum():
    t = stratified_times(8, torch.device("cpu"), torch.Generator().manual_seed(3))
    assert sorted((t * 8).floor().long().tolist()) == list(range(8))


class FixedLogits:
    """A denoiser whose logits are fixed, so the loss is computable by hand."""

    def __init__(self, logits):
        self.logits = logits
        self.calls = 0

    def __call__(self, x_t, t, self_cond=None):
        self.calls += 1
        return Prediction(x0=torch.zeros_like(x_t), logits=self.logits)


class Spy(TimeSampler):
    """Records what the process hands it through ``observe``."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def observe(self, t, loss):
        self.seen.append((t, loss))


def test_ce_loss_is_hand_computed_cross_entropy():
    process = GaussianProcess(
        vocab_size=3, embed_dim=4, input=VectorInput(self_cond_prob=0.0), time_sampler=Spy()
    )
    tokens = torch.tensor([[0, 2]])
    logits = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 1.0, 3.0]]])
    out = process.loss(FixedLogits(logits), {"tokens": tokens})
    p0 = math.exp(2) / (math.exp(2) + 2)
    p1 = math.exp(3) / (1 + math.exp(1) + math.exp(3))
    expected = -(math.log(p0) + math.log(p1)) / 2
    assert out.loss.item() == pytest.approx(expected, rel=1e-6)
    # PAD (valid=False) is left out of the average
    only_first = {"tokens": tokens, "valid": torch.tensor([[True, False]])}
    out_pad = process.loss(FixedLogits(logits), only_first)
    assert out_pad.loss.item() == pytest.approx(-math.log(p0), rel=1e-6)
    # loss changes nothing; observe hands the time sampler (levels, per-sequence CE)
    assert process.time_sampler.seen == []
    level, per_seq = out.observation
    assert level.shape == (1,) and per_seq.item() == pytest.approx(expected, rel=1e-6)
    process.observe(out)
    assert len(process.time_sampler.seen) == 1
    assert process.time_sampler.seen[0][1].item() == pytest.approx(expected, rel=1e-6)
    process.eval()  # evaluation observes nothing
    assert process.loss(FixedLogits(logits), {"tokens": tokens}).observation is None


def test_self_conditioning_runs_a_second_pass():
    logits = torch.zeros(1, 2, 3)
    process = GaussianProcess(vocab_size=3, embed_dim=4, input=VectorInput(self_cond_prob=1.0))
    den = FixedLogits(logits)
    process.train()
    process.loss(den, {"tokens": torch.tensor([[0, 1]])})
    assert den.calls == 2
    process.eval()
    process.loss(den, {"tokens": torch.tensor([[0, 1]])})
    assert den.calls == 3


def test_mse_objective_is_mse_plus_rounding():
    torch.manual_seed(0)
    process = GaussianProcess(
        vocab_size=5,
        embed_dim=4,
        objective=X0MSE(),
        input=VectorInput(self_cond_prob=0.0),
        schedule=CosineSchedule(),
    )
    tokens = torch.tensor([[1, 3, 4]])
    x0 = process.embedding(tokens)

    def oracle(x_t, t, self_cond=None):
        return Prediction(x0=x0, logits=process.embedding.logits(x0))

    out = process.loss(oracle, {"tokens": tokens})
    assert out.metrics["mse"].item() == pytest.approx(0.0, abs=1e-10)
    assert out.loss.item() == pytest.approx(out.metrics["rounding"].item())
    # the rounding term is a real cross-entropy of the low-noise readout
    assert (
        0 <= out.metrics["rounding"].item() < F.cross_entropy(torch.zeros(3, 5), tokens[0]).item()
    )


def test_objective_is_chosen_by_config_and_a_bad_one_is_refused():
    """Objectives are objects picked by the objective config group: an unknown one fails at
    config time listing the valid ones, and each valid one builds its objective."""
    from hydra.utils import instantiate

    from cdlm.configs import compose_checked
    from cdlm.validation import UsageError

    with pytest.raises(UsageError, match="objective/l1.*ce mse"):
        compose_checked("train", ["objective@process.objective=l1"])
    for name, kind in (("ce", CrossEntropy), ("mse", X0MSE)):
        cfg = compose_checked("train", [f"objective@process.objective={name}"])
        assert isinstance(instantiate(cfg.process.objective), kind)
    # the x0 objective has no logits to sharpen: a sampling temperature is refused
    process = GaussianProcess(vocab_size=5, embed_dim=4, objective=X0MSE())
    net = Transformer(**process.network_kwargs, d_model=16, n_layers=1, n_heads=2, max_seq_len=8)
    with pytest.raises(ValueError, match="temperature"):
        process.make_denoiser(net, temperature=0.5)


def test_gaussian_temperature_moves_x0_towards_the_most_likely_embedding():
    torch.manual_seed(0)
    proc = GaussianProcess(20, embed_dim=4).eval()
    net = Transformer(**proc.network_kwargs, d_model=16, n_layers=1, n_heads=2, max_seq_len=8)
    x, t = torch.randn(2, 8, 4), torch.full((2,), 0.5)
    plain = proc.make_denoiser(net)(x, t)
    cold = proc.make_denoiser(net, temperature=1e-4)(x, t)
    torch.testing.assert_close(cold.logits, plain.logits / 1e-4)
    nearest = proc.embedding(plain.logits.argmax(-1))
    torch.testing.assert_close(cold.x0, nearest, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="temperature"):
        proc.make_denoiser(net, temperature=0.0)
