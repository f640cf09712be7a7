"""data.prompt_rate (cdlm/worlds/prompt_rows.py): world training rows with a prompt, in the shapes
and share asked for, keyed as the tokens are, absent from validation; a run trains on them and a
process that cannot hold a prompt is refused."""

from __future__ import annotations

import copy
import math
from itertools import islice

import pytest
import torch
from test_world_data import WORLD_TRAIN, data

from cdlm.worlds.prompt_rows import PromptRows

L = 12


def shape_of(row: list[bool]) -> tuple[str, int, int] | None:
    """('prefix', k, L) or ('infill', a, b) of a row's marks; None if it is neither."""
    if not any(row):
        return ("none", 0, 0)
    k = row.index(False) if False in row else len(row)
    if all(row[:k]) and not any(row[k:]) and 1 <= k <= len(row) - 1:
        return ("prefix", k, len(row))
    a = row.index(False)
    b = a + row[a:].index(True) if True in row[a:] else len(row)
    if 1 <= a < b <= len(row) - 1 and all(row[:a]) and not any(row[a:b]) and all(row[b:]):
        return ("infill", a, b)
    return None


def test_marks_take_every_shape_in_the_share_asked_for():
    n, rate = 6000, 0.3
    marks = PromptRows(rate).mark(n, L, torch.Generator().manual_seed(0))
    assert marks.shape == (n, L) and marks.dtype == torch.bool
    shapes = [shape_of(r) for r in marks.tolist()]
    assert None not in shapes  # every row a prefix, a middle span between fixed ends, or free
    prompted = sum(s[0] != "none" for s in shapes) / n
    assert abs(prompted - rate) < 4 * math.sqrt(rate * (1 - rate) / n)
    infills = sum(s[0] == "infill" for s in shapes)
    assert abs(infills / (prompted * n) - 0.5) < 4 * math.sqrt(0.25 / (prompted * n))
    # every prefix length 1..L-1 and every span 1 <= a < b <= L-1 is drawn
    assert {s[1] for s in shapes if s[0] == "prefix"} == set(range(1, L))
    spans = {(s[1], s[2]) for s in shapes if s[0] == "infill"}
    assert spans == {(a, b) for a in range(1, L - 1) for b in range(a + 1, L)}
    only = PromptRows(1.0, ("prefix",)).mark(200, L, torch.Generator().manual_seed(1))
    assert {shape_of(r)[0] for r in only.tolist()} == {"prefix"}


def test_world_batches_carry_prompts_keyed_as_their_tokens():
    first = next(iter(data(prompt_rate=0.5).train_dataloader()))
    again = next(iter(data(prompt_rate=0.5).train_dataloader()))
    other = [b["prompt"] for b in islice(data(prompt_rate=0.5, seed=1).train_dataloader(), 4)]
    assert first["prompt"].dtype == torch.bool and first["prompt"].shape == first["tokens"].shape
    assert torch.equal(first["prompt"], again["prompt"])
    assert torch.equal(first["tokens"], again["tokens"])
    assert not all(torch.equal(first["prompt"], o) for o in other)
    assert "prompt" not in next(iter(data().train_dataloader()))  # rate 0: unconditional
    finite = data(prompt_rate=1.0, train_size=8)
    assert all(shape_of(r)[0] in ("prefix", "infill") for r in finite.train_set.prompt.tolist())
    assert "prompt" in next(iter(finite.train_dataloader()))
    assert "prompt" not in finite.val_set[0]  # validation stays the unconditional bound


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"prompt_rate": 1.5}, r"data.prompt_rate must be in \[0, 1\], got 1.5"),
        ({"prompt_shapes": ["middle"]}, "data.prompt_shapes must name some of prefix, infill"),
    ],
)
def test_bad_prompt_options_are_refused_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        data(**options)


def test_a_world_run_trains_on_prompts_and_fim_is_refused(tmp_path, monkeypatch, capsys):
    from conftest import train_in_process

    run = [o for o in WORLD_TRAIN if o != "process=masked"]
    train_in_process(
        monkeypatch,
        *run,
        "process=gaussian",
        "process.prompt_view=clean",
        "process.embed_dim=8",
        "data.prompt_rate=1.0",
        f"hydra.run.dir={tmp_path / 'gaussian'}",
    )
    assert (tmp_path / "gaussian" / "model.safetensors").is_file()
    with pytest.raises(SystemExit):
        train_in_process(
            monkeypatch,
            *run,
            "process=autoregressive",
            "process.fim_rate=0.5",
            "data.prompt_rate=0.5",
            f"hydra.run.dir={tmp_path / 'fim'}",
        )
    assert "need process.fim_rate=0" in capsys.readouterr().err


def test_a_world_speaks_a_tokenizer_with_fim_sentinels_only_when_allowed():
    """An AR-FIM model's tokenizer is the world's plus the four sentinels: scored by the world
    (``world_of``) when they are allowed, refused with any other added token."""
    from cdlm.processes import fim
    from cdlm.worlds import load

    world = load("world:agreement")
    tokenizer = copy.deepcopy(world.tokenizer)
    fim.add_tokens(tokenizer)
    assert world.speaks(world.tokenizer) and not world.speaks(tokenizer)
    assert world.speaks(tokenizer, extra=fim.TOKENS)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<other>"]})
    assert not world.speaks(tokenizer, extra=fim.TOKENS)
