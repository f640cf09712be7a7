"""Gaussian prompts shown clean (``process.prompt_view=clean``, ``cdlm.processes.prompts``): what
prompt→response training shows the network at a prompt position is what sampling shows it at a
fixed position, the same input embedding at the same per-token level (0); the ``noised`` view
shows both at the row's own level."""

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from cdlm import config_dir
from cdlm.denoiser import Prediction
from cdlm.processes.gaussian import GaussianProcess

V, D, B, L = 11, 8, 3, 7


class Spy:
    """A denoiser that records what reaches it and predicts nothing in particular."""

    def __init__(self) -> None:
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __call__(self, x_t, t, self_cond=None, **kwargs) -> Prediction:
        self.calls.append((x_t.clone(), t.clone()))
        return Prediction(logits=torch.zeros(*x_t.shape[:2], V), x0=torch.zeros_like(x_t))


def shown(view: str, level: float, positions=None):
    """(training's x_t and per-token t, sampling's x_t and t) for one prompt, the same tokens,
    the network seeing the canvas in a call at ``level``."""
    torch.manual_seed(0)
    process = GaussianProcess(V, D, prompt_view=view).train()
    tokens = torch.randint(3, V, (B, L), generator=torch.Generator().manual_seed(1))
    prompt = torch.zeros(B, L, dtype=torch.bool)
    prompt[:, :3] = True
    train = Spy()
    process.sample_t = lambda n, *args, **kwargs: torch.full((n,), level)  # one level, known
    process.loss(train, {"tokens": tokens, "prompt": prompt}, torch.Generator().manual_seed(2))
    sample = Spy()
    held = process.hold_fixed(sample, tokens, ~prompt, torch.Generator().manual_seed(3))
    x = torch.randn(B, L, D, generator=torch.Generator().manual_seed(4))
    t = torch.full((B,), level)
    if positions is None:
        held(x, t)
    else:
        held(x[:, positions], t, positions=positions)
    (train_x, train_t), (sample_x, sample_t) = train.calls[-1], sample.calls[-1]
    train_t = train_t if train_t.dim() == 2 else train_t[:, None].expand(B, L)
    sample_t = sample_t if sample_t.dim() == 2 else sample_t[:, None].expand(sample_x.shape[:2])
    return prompt, train_x, train_t, sample_x, sample_t


@pytest.mark.parametrize("level", [0.3, 0.9])
def test_training_and_sampling_show_a_clean_prompt_alike(level):
    prompt, train_x, train_t, sample_x, sample_t = shown("clean", level)
    assert torch.equal(train_x[prompt], sample_x[prompt])  # the same input embedding
    assert (train_t[prompt] == 0).all() and (sample_t[prompt] == 0).all()  # at level 0
    assert (train_t[~prompt] == level).all() and (sample_t[~prompt] == level).all()


def test_a_windowed_call_shows_its_fixed_columns_clean():
    positions = torch.tensor([1, 2, 3, 4])  # two prompt columns and two free ones
    prompt, train_x, train_t, sample_x, sample_t = shown("clean", 0.7, positions)
    assert torch.equal(sample_x[:, :2], train_x[:, 1:3])
    assert (sample_t[:, :2] == 0).all() and (sample_t[:, 2:] == 0.7).all()


def test_the_noised_view_shows_the_prompt_at_the_rows_level():
    prompt, train_x, train_t, sample_x, sample_t = shown("noised", 0.9)
    assert (train_t == 0.9).all() and (sample_t == 0.9).all()
    # the truth noised to 0.9 (different draws): far from its level-0 embedding in both
    _, clean_x, *_ = shown("clean", 0.9)
    for x in (train_x, sample_x):
        assert (x[prompt] - clean_x[prompt]).norm(dim=-1).min() > 0.5


def test_the_option_composes_and_a_bad_view_is_named():
    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        cfg = compose("train", overrides=["process=gaussian", "process.prompt_view=clean"])
    assert cfg.process.prompt_view == "clean"
    process = instantiate(cfg.process, vocab_size=V, eos_id=1, schedule=instantiate(cfg.schedule))
    assert process.prompt_view == "clean"
    with pytest.raises(ValueError, match="unknown prompt_view 'blurred'; valid: noised, clean"):
        GaussianProcess(V, D, prompt_view="blurred")
