"""Batches of different prompts (``cdlm.generation.rows``): every row of a mixed batch (prompts
of different lengths, an infill template) comes out token for token as it does sampled alone
with its own seed (``seed + row``), for each process, its default sampler and a few others.

The tiny networks run in float64 here: a batch of several rows and a row alone run matmuls of
different shapes (and the padded batch a masked attention), whose float32 sums may differ in
the last bit and, rarely, flip a draw; float64 leaves such differences far below any draw's
margin, while padding that leaked into attention would still change whole rows."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import run_main, train_tiny

from cdlm.generation import Plan, default_sampler, generate, named_sampler
from cdlm.generation.inputs import Row, read_layout, read_rows
from cdlm.generation.rows import generate_rows
from cdlm.model_file import load_model

ROWS = [
    Row(prompt="the", max_new_tokens=6),
    Row(prompt="it was a long time", max_new_tokens=3),
    Row(prompt="she said that"),
    Row(infill="the [[3]] of [[2]] and"),
]

PROCESSES = {
    "ar": ("process=autoregressive",),
    "masked": ("process=masked",),
    "block": ("process=block", "process.block_size=4"),
    "gaussian": ("process.embed_dim=8",),
    "uniform": ("process=uniform",),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_corpus):
    cache = {}

    def get(kind: str):
        if kind not in cache:
            model = load_model(train_tiny(tmp_path_factory, tiny_corpus, *PROCESSES[kind]))
            model.network.double()
            cache[kind] = model
        return cache[kind]

    return get


def alone(model, sampler, row: Row, seed: int, steps: int) -> list[int]:
    layout = read_layout(
        model, 16, prompt=row.prompt, infill=row.infill, max_new_tokens=row.max_new_tokens
    )
    plan = Plan(num_samples=1, seq_len=len(layout.ids), steps=steps, seed=seed, layout=layout)
    return generate(model, sampler, plan).samples[0].token_ids


# (process, sampler and its options; None: the process's default). Block decoding whose steps
# are shared out over the blocks splits them by the batch's longest canvas, hence
# steps_per_block (docs/conditioning.md).
CASES = [
    ("ar", None, {}),
    ("masked", None, {}),
    ("masked", "threshold", {}),
    ("masked", "confidence", {}),
    ("block", "block", {"steps_per_block": 2}),
    ("gaussian", None, {}),
    ("gaussian", "ddpm", {}),
    ("uniform", None, {}),
]


@pytest.mark.parametrize(("kind", "name", "options"), CASES)
def test_a_row_in_a_mixed_batch_is_the_row_alone(models, kind, name, options):
    model = models(kind)
    sampler = named_sampler(name, **options) if name else default_sampler(model.process)
    rows = ROWS[:3] if kind == "ar" else ROWS  # a causal model without FIM takes prompts only
    plan = Plan(num_samples=1, seq_len=16, steps=8, seed=5, batch_size=None)
    mixed = generate_rows(model, sampler, plan, rows)
    assert len({len(r.token_ids) for r in mixed.rows}) > 1  # the canvases differ in length
    for i, row in enumerate(rows):
        assert mixed.rows[i].seed == 5 + i
        assert mixed.rows[i].token_ids == alone(model, sampler, row, 5 + i, 8), (kind, name, i)
