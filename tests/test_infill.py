"""Infilling and editing: fixed regions come back byte-identical for every sampler, and the
network sees them the way each process promises (noised truth; never masked)."""

from __future__ import annotations

import pytest
import torch
from conftest import draw_from
from hydra.utils import instantiate
from omegaconf import OmegaConf

from cdlm import config_dir
from cdlm.data.corpus import load_documents
from cdlm.data.tokenizer import corpus_bpe
from cdlm.generation.choice import with_cache
from cdlm.guidance import Guidance
from cdlm.networks.transformer import Transformer
from cdlm.processes import (
    AutoregressiveProcess,
    BlockProcess,
    GaussianProcess,
    MaskedProcess,
    UniformProcess,
    fim,
)
from cdlm.processes.hybrid import HybridMasking
from cdlm.processes.inputs import PosteriorInput
from cdlm.regions import assemble, build_layout, parse_template, prompt_template
from cdlm.samplers import SAMPLERS, uniform_grid
from cdlm.samplers.blockwise import DualCache, PrefixCache
from cdlm.samplers.gaussian import rolling
from cdlm.schedules import CosineMaskSchedule

L = 56  # the networks' training length; every canvas here is shorter
TEMPLATE = "It was [[3]] the morning, and [[some doubt]] remained [[2]] at Kellynch."
GAP_END = "It was [[3]] the morning, and [[some doubt]] remained [[4]]"  # ends with a gap
FIXED = {  # each template's fixed texts, in order
    TEMPLATE: ["It was ", " the morning, and ", " remained ", " at Kellynch."],
    GAP_END: ["It was ", " the morning, and ", " remained "],
}
BLOCK_SIZE = 4  # block diffusion's; the templates' canvases are not whole blocks


@pytest.fixture(scope="module")
def tok(tiny_corpus):
    return corpus_bpe(load_documents(str(tiny_corpus)), vocab_size=300)


@pytest.fixture(scope="module")
def fim_tok(tiny_corpus):
    """The same BPE with the fill-in-the-middle sentinels added, for the AR-FIM model."""
    tok = corpus_bpe(load_documents(str(tiny_corpus)), vocab_size=300)
    fim.add_tokens(tok)
    return tok


def model(process):
    torch.manual_seed(0)
    kw = process.network_kwargs
    net = Transformer(**kw, d_model=16, n_layers=1, n_heads=2, max_seq_len=L + 1)
    return net.eval()


def processes(tok, fim_tok=None):
    """One untrained process per kind; an AR one trained to fill in the middle with ``fim_tok``
    (its sentinels' ids are those ``fim.add_tokens`` finds there)."""
    v, mask, eos = len(tok), tok.mask_token_id, tok.eos_token_id
    found = {}
    if fim_tok is not None:
        sentinels = fim.add_tokens(fim_tok)
        ar = AutoregressiveProcess(len(fim_tok), eos, fim_rate=0.5, fim_ids=sentinels)
        found["autoregressive"] = ar.eval()
    return found | {
        "gaussian": GaussianProcess(v, embed_dim=4).eval(),
        "masked": MaskedProcess(v, mask_id=mask, eos_id=eos).eval(),
        "masked_shift": MaskedProcess(v, mask_id=mask, eos_id=eos, shift=True).eval(),
        "block": BlockProcess(v, mask_id=mask, block_size=BLOCK_SIZE, eos_id=eos).eval(),
        "uniform": UniformProcess(v).eval(),
        "hybrid": GaussianProcess(
            v, embed_dim=4, input=PosteriorInput(), hybrid=HybridMasking(CosineMaskSchedule())
        ).eval(),
    }


def template_length(tok, template: str) -> int:
    """The canvas a template should get, counted apart from ``build_layout``: each fixed text
    and editable span's own tokens, and each blank's N."""
    return sum(
        seg.blank_tokens or len(tok(seg.text, add_special_tokens=False)["input_ids"])
        for seg in parse_template(template)
    )


def sampler_cases():
    """(sampler, process kind, sampler options): masked also in blocks, with each KV cache
    where the sampler takes one; ddpm/ddim also rolling; block diffusion with and without its
    prefix cache; the autoregressive baseline trained to fill in the middle, with and without
    its KV cache (without FIM it takes prompts only, see below)."""
    caches = {"prefix": PrefixCache(), "dual": DualCache()}
    for name, kinds in sorted(SAMPLERS.items()):
        for kind in kinds:
            if name == "speculative":
                continue  # prompts only (tests/test_speculative.py)
            if name == "hybrid":  # a gaussian model trained with process.hybrid only
                yield name, "hybrid", {}
                continue
            if kind in ("block", "autoregressive"):
                yield name, kind, {}
                yield name, kind, {"cache": None} if kind == "block" else {"use_cache": False}
                continue
            yield name, kind, {}
            if kind == "masked":
                yield name, kind, {"block_length": 8}
                if name != "cached_ancestral":  # it has no KV cache
                    for cache in caches.values():
                        yield name, kind, {"block_length": 8, "cache": cache}
            if name in ("ddpm", "ddim"):
                yield name, kind, {"token_steps": 2, "draw_tokens": True}


def case_id(case) -> str:
    name, kind, options = case
    shown = {k: getattr(v, "name", v) for k, v in options.items()}
    return "-".join([name, kind, *(f"{k}={v}" for k, v in shown.items())])


def make_sampler(name: str, options: dict):
    cfg = OmegaConf.load(config_dir() / "sampler" / f"{name}.yaml")
    plain = {k: v for k, v in options.items() if k != "cache"}
    sampler = instantiate(OmegaConf.merge(cfg, plain))
    return with_cache(sampler, options["cache"]) if "cache" in options else sampler


@pytest.mark.parametrize("template", [TEMPLATE, GAP_END], ids=["fixed-end", "gap-end"])
@pytest.mark.parametrize("strength", [1.0, 0.5], ids=["infill", "edit"])
@pytest.mark.parametrize(
    "name, kind, options", [pytest.param(*c, id=case_id(c)) for c in sampler_cases()]
)
def test_every_sampler_returns_exactly_the_template(
    tok, fim_tok, name, kind, options, strength, template
):
    """Fixed regions come back byte-identical, and the output is the template's regions and
    nothing more: it ends with the last fixed text, or with the last gap filled."""
    sampler = make_sampler(name, options)
    segments = parse_template(template)
    n = template_length(tok, template)
    for key, process in processes(tok, fim_tok).items():
        if not key.startswith(kind):
            continue
        canvas = build_layout(segments, tok, L, tok.mask_token_id)
        assert len(canvas.ids) == n < L and n % BLOCK_SIZE and n % 8  # last blocks partial
        out = draw_from(
            process,
            model(process),
            tok,
            sampler,
            steps={"adaptive": 1, "exact_k": 4 * n}.get(name, 3),  # exact_k: a token a step
            num_samples=2,
            seq_len=n,
            seed=1,
            cut_at_eos=False,
            layout=canvas,
            strength=strength,
        )
        for s in out.samples:
            assert len(s.token_ids) == n
            fixed = [i for i, e in enumerate(canvas.editable) if not e]
            assert [s.token_ids[i] for i in fixed] == [canvas.ids[i] for i in fixed]
            text, regions = assemble(canvas, s.token_ids, tok)  # raises if a fixed id moved
            assert [r.input for r in regions] == [(seg.start, seg.end) for seg in segments]
            pieces = [r.text for r in regions if r.kind == "fixed"]
            assert pieces == FIXED[template]
            assert all(text[r.output[0] : r.output[1]] == r.text for r in regions)
            last = regions[-1]
            assert last.tokens[1] == n and last.output[1] == len(text)
            if template == TEMPLATE:
                assert last.kind == "fixed" and text.endswith(" at Kellynch.")
            else:
                assert last.kind == "generated" and last.tokens == (n - 4, n)
            # every gap filled: no [MASK] left (uniform noise has no absorbing token: [MASK] is
            # one more token of its vocabulary, as in the reference)
            if kind not in ("gaussian", "autoregressive", "uniform"):
                assert tok.mask_token_id not in s.token_ids


class Spy(torch.nn.Module):
    """Wraps a network and records its inputs."""

    def __init__(self, net):
        super().__init__()
        self.net, self.seen = net, []

    def forward(self, x, t, self_cond=None, label=None, **kw):
        self.seen.append((x.detach().clone(), t.detach().clone()))
        return self.net(x, t, self_cond, label=label, **kw)


@pytest.mark.parametrize("options", [{}, {"token_steps": 2}], ids=["shared", "rolling"])
def test_gaussian_network_sees_fixed_positions_as_correctly_noised_truth(tok, options):
    process = processes(tok)["gaussian"]
    spy = Spy(model(process))
    canvas = build_layout(parse_template(TEMPLATE), tok, L, 0)
    n = len(canvas.ids)
    cfg = OmegaConf.load(config_dir() / "sampler" / "ddpm.yaml")
    sampler = instantiate(OmegaConf.merge(cfg, options))
    draw_from(
        process,
        spy,
        tok,
        sampler,
        steps=4,
        num_samples=1,
        seq_len=n,
        layout=canvas,
    )
    fixed = ~torch.tensor(canvas.editable)
    x0 = process.embedding(torch.tensor(canvas.ids))[fixed]
    implied = []
    held_levels = [row[fixed].float() for row in rolling(uniform_grid(4), n, 2)[:-1]]
    for x, t in spy.seen:  # the network gets the mean level; HoldFixed each token's own
        level = (held_levels.pop(0) if options else t[:1].expand(len(x0)))[:, None]
        alpha, sigma = process.schedule.alpha(level), process.schedule.sigma(level)
        implied.append((x[0][fixed] - alpha * x0) / sigma)  # the noise behind what it saw
    # One noise draw for the run: every step's input is alpha(t) x0 + sigma(t) * that draw.
    for eps in implied[1:]:
        torch.testing.assert_close(eps, implied[0], atol=1e-4, rtol=1e-4)
    assert 0.5 < implied[0].std() < 1.5


def test_masked_edit_remasks_only_the_editable_spans(tok):
    process = processes(tok)["masked"]
    canvas = build_layout(parse_template(TEMPLATE), tok, L, tok.mask_token_id)
    ids = torch.tensor(canvas.ids).expand(64, -1)
    editable = torch.tensor(canvas.editable).expand(64, -1)
    g = torch.Generator().manual_seed(0)
    seeded = torch.tensor(canvas.seeded).expand(64, -1)
    start = process.start(ids.clone(), ids, editable, seeded, 0.5, g)
    assert torch.equal(start[~editable], ids[~editable])
    masked = start == tok.mask_token_id
    assert 0.3 < masked[seeded].float().mean() < 0.7  # the [[some doubt]] span: ~1 - keep(0.5)
    assert masked[editable & ~seeded].all()  # blanks start fully masked
    full = process.start(ids.clone(), ids, editable, seeded, 1.0, g)
    assert torch.equal(full == tok.mask_token_id, editable)


def test_autoregressive_takes_a_prompt_but_refuses_infill(tok):
    """A prompt keeps its tail (the continuation is the point), to the whole canvas."""
    process = AutoregressiveProcess(len(tok), bos_id=tok.eos_token_id).eval()
    net = model(process)
    sampler = instantiate(OmegaConf.load(config_dir() / "sampler" / "ar.yaml"))
    canvas = build_layout(prompt_template("It was the morning"), tok, L, 0)
    out = draw_from(
        process,
        net,
        tok,
        sampler,
        steps=1,
        num_samples=2,
        seq_len=L,
        cut_at_eos=False,
        layout=canvas,
    )
    k = len(tok("It was the morning", add_special_tokens=False)["input_ids"])
    for s in out.samples:
        text, regions = assemble(canvas, s.token_ids, tok)
        assert text.startswith("It was the morning") and len(s.token_ids) == L
        assert [(r.kind, r.tokens) for r in regions] == [("fixed", (0, k)), ("generated", (k, L))]
    infill = build_layout(parse_template(TEMPLATE), tok, L, 0)
    with pytest.raises(ValueError, match="only left context"):
        draw_from(
            process,
            net,
            tok,
            sampler,
            steps=1,
            num_samples=1,
            seq_len=len(infill.ids),
            layout=infill,
        )


def test_gaussian_edit_starts_text_spans_from_their_noised_embeddings_and_blanks_from_noise(tok):
    process = processes(tok)["gaussian"]
    canvas = build_layout(parse_template(TEMPLATE), tok, L, tok.mask_token_id)
    ids = torch.tensor(canvas.ids)[None]
    editable, seeded = torch.tensor(canvas.editable)[None], torch.tensor(canvas.seeded)[None]
    prior = torch.randn(1, len(canvas.ids), 4, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1)
    x = process.start(prior, ids, editable, seeded, 0.02, g)  # barely noised
    blanks = editable & ~seeded
    assert torch.equal(x[blanks], prior[blanks]) and torch.equal(x[~editable], prior[~editable])
    nearest = process.embedding.nearest(x)
    assert torch.equal(nearest[seeded], ids[seeded])  # the text to edit is still readable


def test_guidance_and_fixed_regions_compose(tok):
    """A conditional masked model, guided at w = 3, still returns the fixed text."""
    process = processes(tok)["masked"]
    torch.manual_seed(0)
    net = Transformer(
        **process.network_kwargs,
        d_model=16,
        n_layers=1,
        n_heads=2,
        max_seq_len=L + 1,
        num_classes=2,
    ).eval()
    torch.nn.init.normal_(net.label_embed.weight)
    canvas = build_layout(parse_template(TEMPLATE), tok, L, tok.mask_token_id)
    sampler = instantiate(OmegaConf.load(config_dir() / "sampler" / "ancestral.yaml"))
    out = draw_from(
        process,
        net,
        tok,
        sampler,
        steps=4,
        num_samples=2,
        seq_len=len(canvas.ids),
        cut_at_eos=False,
        layout=canvas,
        guidance=Guidance(label=1, scale=3.0),
    )
    for s in out.samples:
        assemble(canvas, s.token_ids, tok)
