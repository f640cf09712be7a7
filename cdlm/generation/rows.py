"""Batches of different prompts: each row its own canvas (a prompt to continue or an infill
template, ``cdlm.generation.inputs.Row``) and its own random stream, the rows of a batch drawn in
one sampler call, so that a row comes out token for token as it would alone.

Row r (after each row is repeated ``plan.num_samples`` times) draws from the generator of seed
``rng.member_seed(plan.seed, r)`` (``cdlm.rng.Rows``; row 0 keeps ``plan.seed``, and sets drawn
with different seeds share no row's stream): the row alone, ``generate`` with that seed (its
record's ``seed``), draws the same numbers. Prompt guidance (``plan.guidance``, on the fixed
text) draws row r's blanks from ``rng.blanks_generator`` of the row's seed, as ``generate`` does
for the row alone. Canvases of different lengths are padded on the right to the batch's longest: for a bidirectional network the padding is held fixed (EOS) and hidden from every
query (``cdlm.denoiser.Unpadded``, the network's ``lengths``); a causal network never looks
right, so there the padding is just more canvas, generated and cut off.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from cdlm import rng
from cdlm.denoiser import Unpadded
from cdlm.generation.generate import sampled_ids, self_cond_extra, time_grid
from cdlm.generation.inputs import Row, row_layouts
from cdlm.generation.plan import Plan
from cdlm.model_file import Model
from cdlm.modes import eval_mode
from cdlm.processes.base import Fixed
from cdlm.regions import Layout, Region, assemble
from cdlm.samplers import check_compatible
from cdlm.samplers.base import Callback


@dataclass
class RowSample:
    """One row's draw: its canvas, the sampled ids (one per canvas position), the whole text
    (fixed regions as written, EOS as a line break), the region map, ``completion`` (a prompt
    row: the tokens after the prompt up to the first EOS, decoded; an infill row: its text),
    and the seed its generator took."""

    row: Row
    layout: Layout
    token_ids: list[int]
    text: str
    regions: list[Region]
    completion: str
    seed: int


@dataclass
class RowsGeneration:
    """Every row's sample, in order; nfe and positions per sequence (the most of any batch:
    batches of longer canvases take more AR steps); wall_seconds: all batches."""

    rows: list[RowSample]
    nfe: int
    positions: int
    wall_seconds: float


@torch.no_grad()
def generate_rows(
    model: Model,
    sampler: Callable,
    plan: Plan,
    rows: list[Row],
    callback: Callback | None = None,
    what: str = "row",
    seeds: list[int] | None = None,
) -> RowsGeneration:
    """Draws every row ``plan.num_samples`` times with ``sampler``, ``plan.batch_size`` rows per
    sampler call. ``plan.seq_len`` bounds each canvas (a prompt without ``max_new_tokens`` fills
    it); the plan's own layout and edit strength must be unset; ``plan.guidance`` may guide on
    the rows' fixed text (``guidance.on`` prompt or auto; no label). ``what`` names a row in
    errors (``line`` for a prompts file). ``seeds``: each row's own seed (one per row, with
    ``plan.num_samples`` 1), so that requests batched together by ``cdlm.serve`` each draw as
    their own seed alone would; None: ``member_seed(plan.seed, r)``."""
    process, network = model.process, model.network
    check_compatible(sampler, process.kind)
    if plan.layout is not None or plan.strength != 1.0:
        raise ValueError("rows carry their own canvases and are drawn without edits")
    if plan.guidance.label is not None:
        raise ValueError("rows are guided on their fixed text only, not on a label")
    guided = plan.guidance.guides_prompt(True)
    if guided and process.sequential:
        raise ValueError(
            "prompt guidance needs a process whose network sees the whole canvas (masked, "
            "gaussian); the autoregressive baseline reads the prompt as its left context only"
        )
    if seeds is not None and (plan.num_samples != 1 or len(seeds) != len(rows)):
        raise ValueError("seeds= gives one seed per row, with num_samples 1")
    layouts = row_layouts(model, plan.seq_len, rows, what)
    layouts = [lay for lay in layouts for _ in range(plan.num_samples)]
    sources = [row for row in rows for _ in range(plan.num_samples)]
    device = next(network.parameters()).device
    timesteps = time_grid(model, plan, device)
    out_rows, nfe, positions, start = [], 0, 0, time.perf_counter()
    size = plan.batch_size or len(layouts)
    with eval_mode(network):
        for first in range(0, len(layouts), size):
            batch = layouts[first : first + size]
            drawn = [
                rng.member_seed(plan.seed, first + k) if seeds is None else seeds[first + k]
                for k in range(len(batch))
            ]
            lengths = [len(b.ids) for b in batch]
            generator = rng.Rows([rng.generator(s, device) for s in drawn], lengths)
            blanks = rng.Rows([rng.blanks_generator(s, device) for s in drawn], lengths)
            x, denoiser = _padded(model, plan, batch, generator, blanks if guided else None)
            out = sampler(
                denoiser, x, timesteps, process=process, generator=generator, callback=callback
            )
            for k, ids in enumerate(sampled_ids(model, plan, out)):
                row, layout = sources[first + k], batch[k]
                out_rows.append(_row_sample(model, row, layout, ids[: len(layout.ids)], drawn[k]))
            calls = out.nfe + self_cond_extra(plan, out.nfe)
            width = max(len(b.ids) for b in batch)
            done = out.positions if out.positions is not None else out.nfe * width
            nfe, positions = max(nfe, calls), max(positions, done * calls // max(out.nfe, 1))
    passes = plan.guidance.passes(True)
    nfe, positions = nfe * passes, positions * passes
    return RowsGeneration(out_rows, nfe, positions, time.perf_counter() - start)


def _padded(
    model: Model, plan: Plan, batch: list[Layout], generator: rng.Rows, blanks: rng.Rows | None
) -> tuple[torch.Tensor, Callable]:
    """The batch's starting state on the longest canvas and the denoiser that holds each row's
    fixed regions (and its padding, hidden from a bidirectional network), guided on each row's
    fixed text when ``blanks`` (the prior's draws there) is given."""
    process, width, device = model.process, generator.width, generator.device
    eos = model.tokenizer.eos_token_id
    open_tail = process.sequential  # a causal network: the padding is generated, then cut

    def pad(values: list, fill) -> list:
        return values + [fill] * (width - len(values))

    ids = torch.tensor([pad(b.ids, eos) for b in batch], device=device)
    editable = torch.tensor([pad(b.editable, open_tail) for b in batch], device=device)
    seeded = torch.tensor([pad(b.seeded, False) for b in batch], device=device)
    x = process.prior((len(batch), width), device, generator)
    x = process.start(x, ids, editable, seeded, 1.0, generator)
    lengths = generator.lengths
    prompt = torch.tensor([pad([not e for e in b.editable], False) for b in batch], device=device)
    blank = None if blanks is None else process.prior((len(batch), width), device, blanks)

    def guide(denoiser: Callable) -> Callable:
        if not open_tail and min(lengths) < width:
            denoiser = Unpadded(denoiser, lengths, device)
        return plan.guidance.wrap(denoiser, len(batch), device, where=prompt, blank=blank)

    denoiser = process.conditioned_denoiser(
        model.network,
        guide=guide,
        fixed=Fixed(ids, editable),
        generator=generator,
        **plan.denoising,
    )
    return x, denoiser


def _row_sample(model: Model, row: Row, layout: Layout, ids: list[int], seed: int) -> RowSample:
    """A row's record: its assembled text and, for a prompt, the completion after it."""
    tok = model.tokenizer
    text, regions = assemble(layout, ids, tok)
    completion = text
    if row.prompt is not None:
        tail = ids[sum(not e for e in layout.editable) :]
        if tok.eos_token_id in tail:
            tail = tail[: tail.index(tok.eos_token_id)]
        completion = tok.decode(tail, skip_special_tokens=True)
    return RowSample(row, layout, ids, text, regions, completion, seed)
