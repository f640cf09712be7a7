"""One contract every step rule of the masked decoding loop passes (``cdlm.samplers.rules``,
``cdlm.samplers.remdm``), on masked and block diffusion, through every way the loop predicts.

``ROWS`` holds one row per rule class: its variants (one per schedule or mode worth running)
and the network calls it may make beyond the step budget (none so far). A rule class that a
``conf/sampler/*.yaml`` chooses (``rule._target_``) or that subclasses ``Rule`` in
``cdlm.samplers`` without a row fails ``test_every_rule_has_a_row``, naming it.

The denoiser is the contract's ``Seeing`` oracle (tests/test_sampler_contract.py): certain of
the data wherever what it sees through the KV cache is right. Every rule must give the data
back (a revising rule after its last step), leave the prompt alone, spend at most its step
budget, and, unless it revises, never change a committed token.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from dataclasses import dataclass, field

import pytest
import torch
from omegaconf import OmegaConf
from test_sampler_contract import SEED, B, L, V, make_network, make_process, oracle

import cdlm.samplers
from cdlm import config_dir
from cdlm.samplers import uniform_grid
from cdlm.samplers.blockwise import DualCache, PrefixCache
from cdlm.samplers.masked import sample_masked
from cdlm.samplers.remdm import ReMDM
from cdlm.samplers.rules import (
    Ancestral,
    CachedAncestral,
    Confidence,
    EntropyBounded,
    ExactK,
    Rule,
    Threshold,
)

STEPS, PROMPT = 8, 2  # the first PROMPT positions are given


@dataclass(frozen=True)
class Row:
    """A rule class's variants, the calls it may make beyond the step budget, and the settings
    it runs in (all but the ones its registered process kinds or its docstring rule out)."""

    variants: list[Rule]
    extra_nfe: int = 0
    ids: list[str] = field(default_factory=list)
    settings: tuple[str, ...] = ()  # () : every setting


ROWS: dict[str, Row] = {
    "cdlm.samplers.rules.Ancestral": Row([Ancestral()]),
    # whole-canvas only: it skips calls instead of caching (refused elsewhere, by name)
    "cdlm.samplers.rules.CachedAncestral": Row(
        [CachedAncestral()], settings=("masked", "masked-blocks")
    ),
    "cdlm.samplers.rules.Confidence": Row([Confidence()]),
    "cdlm.samplers.rules.Threshold": Row([Threshold(), Threshold(temperature=1.0)]),
    "cdlm.samplers.rules.EntropyBounded": Row([EntropyBounded(gamma=0.5)]),
    # k = 3 commits 3 then 1 of a block of 4 at its 4 steps (6 masked: 3, 3 of the canvas)
    "cdlm.samplers.rules.ExactK": Row([ExactK(), ExactK(k=3)], ids=["k1", "k3"]),
    "cdlm.samplers.remdm.ReMDM": Row(
        [
            ReMDM(schedule="cap", eta=0.5),
            ReMDM(schedule="rescale", eta=0.9),
            ReMDM(schedule="conf"),
            ReMDM(schedule="loop", eta=0.1, t_on=0.7, t_off=0.2),
            ReMDM(schedule="loop", eta=0.1, t_on=0.7),  # t_off 0.05: the last step loops
        ],
        ids=["cap", "rescale", "conf", "loop", "loop_to_the_end"],
    ),
}

# (process kind, sampler options): the whole canvas, masked blocks with each cache, block
# diffusion with its exact cache and without
SETTINGS = {
    "masked": ("masked", {}),
    "masked-blocks": ("masked", {"block_length": 4}),
    "masked-prefix": ("masked", {"block_length": 4, "cache": PrefixCache()}),
    "masked-dual": ("masked", {"block_length": 4, "cache": DualCache()}),
    "block-prefix": ("block", {"cache": PrefixCache()}),
    "block-none": ("block", {"cache": None}),
}


def path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def configured_rules() -> set[str]:
    """The ``rule._target_`` of every sampler config that has a rule."""
    found = set()
    for file in (config_dir() / "sampler").glob("*.yaml"):
        cfg = OmegaConf.load(file)
        if "rule" in cfg:
            found.add(cfg.rule._target_)
    return found


def defined_rules() -> set[str]:
    """Every concrete ``Rule`` subclass in the modules of ``cdlm.samplers``."""
    found = set()
    for info in pkgutil.iter_modules(cdlm.samplers.__path__):
        module = importlib.import_module(f"cdlm.samplers.{info.name}")
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, Rule) and not inspect.isabstract(obj):
                found.add(path(obj))
    return found


def test_every_rule_has_a_row():
    """A rule without a row would skip the whole contract."""
    missing = sorted((configured_rules() | defined_rules()) - set(ROWS))
    assert not missing, f"step rules without a row in ROWS: {missing}"
    stale = sorted(set(ROWS) - defined_rules())
    assert not stale, f"rows in ROWS for rules that no longer exist: {stale}"


CASES = [
    pytest.param(rule, row.extra_nfe, setting, id=f"{name.rsplit('.', 1)[1]}-{vid}-{setting}")
    for name, row in ROWS.items()
    for vid, rule in zip(row.ids or map(str, range(len(row.variants))), row.variants, strict=True)
    for setting in row.settings or SETTINGS
]


@pytest.mark.parametrize(("rule", "extra_nfe", "setting"), CASES)
def test_a_rule_gives_the_oracles_data_back_within_its_budget(rule, extra_nfe, setting):
    kind, options = SETTINGS[setting]
    process = make_process(kind)
    network = make_network(process)
    data = torch.randint(1, V - 1, (B, L), generator=torch.Generator().manual_seed(5))
    start = process.prior((B, L), torch.device("cpu"), None)
    start[:, :PROMPT] = data[:, :PROMPT]
    seen = []
    out = sample_masked(
        oracle(process, network, data),
        start.clone(),
        uniform_grid(STEPS),
        process=process,
        generator=torch.Generator().manual_seed(SEED),
        callback=seen.append,
        rule=rule,
        **options,
    )
    assert torch.equal(out.tokens, data)  # a revising rule: after its last step
    assert out.nfe <= STEPS + extra_nfe
    assert all(torch.equal(st.x[:, :PROMPT], data[:, :PROMPT]) for st in seen)
    if not rule.revises:
        before = start
        for st in seen:
            committed = before != process.mask_id
            assert torch.equal(st.x[committed], before[committed])
            before = st.x
