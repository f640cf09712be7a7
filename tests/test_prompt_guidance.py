"""Prompt guidance (LLaDA-style CFG on the prompt): the unconditional pass sees the prompt at the
prior, w = 1 reproduces unguided prompted sampling exactly and w = 0 the samples of a model that
never sees the prompt (a wrapper written here, independently), w = 2 costs two passes; for the
masked and gaussian processes. Label and prompt combine; the AR baseline refuses it."""

from __future__ import annotations

import pytest
import torch
from conftest import draw, run_main

from cdlm.denoiser import Prediction, Wrapper
from cdlm.guidance import NO_LABEL, Guidance, Guided
from cdlm.model_file import load_model
from cdlm.regions import build_layout, prompt_template


class Spy:
    """Records its inputs; predicts uniform logits."""

    def __init__(self) -> None:
        self.calls = []

    def __call__(self, x, t=None, self_cond=None, **kw):
        self.calls.append((x.clone(), None if t is None else t.clone(), kw.get("label")))
        return Prediction(logits=torch.zeros(*x.shape[:2], 5), x0=torch.zeros(*x.shape[:2], 3))


def test_unconditional_pass_sees_the_prompt_at_the_prior():
    x = torch.arange(12.0).view(2, 3, 2)[..., :1].expand(2, 3, 3).clone()  # (B, L, D) state
    where = torch.tensor([[True, False, False], [True, True, False]])
    blank = torch.full((2, 3, 3), -7.0)
    t = torch.tensor([0.3, 0.6])
    for scale, n_calls in ((0.0, 1), (1.0, 1), (2.0, 1)):
        spy = Spy()
        Guided(spy, None, scale, where, blank)(x, t)
        assert len(spy.calls) == n_calls
        seen, levels, label = spy.calls[0]
        assert label is None  # no label given: none is passed
        if scale == 1.0:  # the conditional pass alone: the state as it is
            assert torch.equal(seen, x) and torch.equal(levels, t)
            continue
        uncond, u_levels = (seen, levels) if scale == 0.0 else (seen[2:], levels[2:])
        assert torch.equal(uncond[where], blank[where]) and torch.equal(uncond[~where], x[~where])
        assert torch.equal(u_levels, torch.where(where, 1.0, t[:, None].expand(2, 3)))
        if scale == 2.0:
            assert torch.equal(seen[:2], x) and torch.equal(levels[:2], t[:, None].expand(2, 3))


def test_both_guides_on_label_and_prompt_in_one_unconditional_pass():
    spy, label = Spy(), torch.tensor([1, 0])
    where = torch.tensor([[True, False]] * 2)
    ids = torch.tensor([[4, 2], [3, 1]])
    Guided(spy, label, 3.0, where, torch.full((2, 2), 9))(ids, torch.tensor([0.5, 0.5]))
    seen, _, labels = spy.calls[0]
    assert labels.tolist() == [1, 0, NO_LABEL, NO_LABEL]
    assert seen.tolist() == [[4, 2], [3, 1], [9, 2], [9, 1]]  # a token state: masked prompt


def test_guidance_targets_and_errors():
    assert Guidance(label=1).targets(prompted=True) == (True, False)  # auto: the label first
    assert Guidance().targets(prompted=True) == (False, True)
    assert Guidance(label=1, on="both").targets(prompted=True) == (True, True)
    with pytest.raises(ValueError, match="needs fixed text"):
        Guidance(on="prompt").targets(prompted=False)
    with pytest.raises(ValueError, match="needs label=NAME"):
        Guidance(on="label").targets(prompted=True)
    with pytest.raises(ValueError, match="valid: auto, label, prompt, both"):
        Guidance(on="title").targets(prompted=True)
    assert Guidance(scale=2.0).passes(prompted=True) == 2
    assert Guidance(scale=1.0, on="prompt").passes(prompted=True) == 1


class Blind(Wrapper):
    """A model that never sees the prompt, written apart from ``Guided``: masked prompt tokens,
    or pure noise at level 1."""

    def __init__(self, denoiser, where, blank) -> None:
        self.denoiser, self.where, self.blank = denoiser, where, blank

    def __call__(self, x, t=None, self_cond=None, **kw):
        if x.is_floating_point():
            x = torch.where(self.where[..., None], self.blank, x)
            per_token = t if t.dim() == 2 else t[:, None]  # rolling samplers: one t per token
            t = torch.where(self.where, 1.0, per_token.expand(self.where.shape))
        else:
            x = torch.where(self.where, self.blank, x)
        return self.denoiser(x, t, self_cond, **kw)


class BlindGuidance(Guidance):
    def wrap(self, denoiser, batch, device, first=0, where=None, blank=None):
        return Blind(denoiser, where, blank)


def sample(model, guidance, canvas, seed: int = 2) -> tuple[list[list[int]], int]:
    gen = draw(
        model,
        steps=6,
        num_samples=3,
        seed=seed,
        guidance=guidance,
        layout=canvas,
        cut_at_eos=False,
    )
    return [s.token_ids for s in gen.samples], gen.nfe


@pytest.mark.parametrize("fixture", ["tiny_checkpoint", "tiny_masked_checkpoint"])
def test_w0_and_w1_reproduce_the_unguided_samples(fixture, request):
    model = load_model(request.getfixturevalue(fixture))
    length = model.config["seq_len"]
    canvas = build_layout(prompt_template("Emma said"), model.tokenizer, length, 0)
    plain, nfe = sample(model, None, canvas)
    assert sample(model, Guidance(scale=1.0, on="prompt"), canvas) == (plain, nfe)
    blind = sample(model, BlindGuidance(scale=0.0, on="prompt"), canvas)
    assert sample(model, Guidance(scale=0.0, on="prompt"), canvas) == blind
    guided, guided_nfe = sample(model, Guidance(scale=2.0, on="prompt"), canvas)
    assert guided_nfe == 2 * nfe
    prompt_len = sum(not e for e in canvas.editable)
    for row in guided:  # the prompt is still held
        assert row[:prompt_len] == canvas.ids[:prompt_len]


def test_the_ar_baseline_refuses_prompt_guidance(tiny_ar_checkpoint):
    model = load_model(tiny_ar_checkpoint)
    canvas = build_layout(prompt_template("Emma"), model.tokenizer, model.config["seq_len"], 0)
    with pytest.raises(ValueError, match="prompt guidance needs a process whose network sees"):
        sample(model, Guidance(scale=2.0, on="prompt"), canvas)


def test_cli_prompt_guidance(tiny_masked_checkpoint, tmp_path):
    args = (f"ckpt={tiny_masked_checkpoint}", "steps=3", "num_samples=1")
    result = run_main("cdlm-sample", *args, 'prompt="Emma"', "guidance.scale=[1,2]", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "(prompt guidance, scale 2)" in result.stdout
    result = run_main("cdlm-sample", *args, "guidance.on=prompt", cwd=tmp_path)
    assert result.returncode == 2
    assert "guidance.on=prompt needs fixed text to guide on" in result.stderr
