"""Where tasks read their inputs (``read:`` in conf/task/*.yaml, the ``Reader`` signature): the
same held-out inputs for every process, from the same split and seed."""

from __future__ import annotations

from cdlm import worlds
from cdlm.evaluation.world_score import world_of
from cdlm.model_file import Model
from cdlm.processes import fim
from cdlm.tasks import games
from cdlm.tasks.base import Inputs
from cdlm.tasks.passages import held_out, world_passages


def passages(
    model: Model, cases: int, seed: int, data_path: str | None = None, val_fraction: float = 0.02
) -> Inputs:
    """Held-out passages of at most the model's length less the FIM sentinels, so that an AR
    model's FIM prompt holds the same passage as every other process's canvas; lengths in
    tokens. A model of an exact world (``ckpt=world:<name>``, or one trained on
    ``data=world:<name>``), or ``data_path`` ``world:<name>``, reads the world's own exact
    samples instead: the bundled corpus is no text of the world's."""
    length = model.config["seq_len"] - fim.SENTINELS
    spec = data_path if worlds.is_world(data_path) else model.config.get("world")
    if spec:
        found = world_passages(world_of(model, spec), spec, cases, length, seed)
    else:
        found = held_out(model, cases, length, seed, data_path, val_fraction)
    return Inputs(found, [len(p.ids) for p in found])


def puzzles(
    model: Model, cases: int, seed: int, data_path: str | None = None, val_fraction: float = 0.02
) -> Inputs:
    """Held-out lines of the puzzle file the model trained on (``games.held_out``); lengths in
    characters."""
    found = games.held_out(model, cases, seed, data_path, val_fraction)
    return Inputs(found, [len(p.line) for p in found])
