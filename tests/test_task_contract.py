"""One contract that every task config passes (tests/test_sampler_contract.py, for tasks).

``CASES`` holds one row per ``conf/task/*.yaml``: the model it runs on, small options, how many
rows it reports and the task's own figures in each. Every row builds its task from its config
(``named_task``), reads its inputs with the task's own reader and runs it through
``suite.report``, with a stand-in scorer (uniform over 50 symbols) when the task is ``scored``;
the report and each row must hold exactly the keys named here. A config without a row fails
``test_every_task_config_has_a_case``, naming it.

The text model is the tiny masked checkpoint's process and tokenizer with an untrained 48-token
network (the checkpoint's 16 tokens leave no room for a constraint); the plan model is the
same network size over a tokenizer of Countdown lines. The contract is the report's shape, not
the figures, so untrained networks do.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import pytest
import torch
from test_quality import CharTokenizer, UniformLM

from cdlm import config_dir
from cdlm.data.corpus import Document
from cdlm.data.tokenizer import corpus_bpe
from cdlm.evaluation.quality import Scorer
from cdlm.generation import default_sampler
from cdlm.io import atomic_write_text
from cdlm.model_file import Model, load_model
from cdlm.networks.transformer import Transformer
from cdlm.processes import MaskedProcess
from cdlm.tasks import games, suite
from cdlm.tasks.base import Reader, TaskRun, named_task

L = 48
REPORT = {"task", "process", "sampler", "steps", "seed", "tokenizer", "input_length"}
REPORT |= {"scorer", "load_s", "rows"}
WORK = {"task", "process", "sampler", "nfe", "positions", "wall_s_median", "revision_rounds"}
WORK |= {"first_stable_s_median", "warmup_s", "spread"}


@dataclass(frozen=True)
class Case:
    model: str  # "text" or "plan"
    rows: int
    figures: set[str]  # the task's own keys in every row (with the stand-in scorer if scored)
    options: dict = field(default_factory=dict)


CASES = {
    "infill": Case(
        "text",
        2,
        {"span", "cases", "token_accuracy", "span_exact", "fixed_intact"}
        | {"scorer_ppl", "original_ppl", "ppl_ratio"},
        {"spans": [1, 4]},
    ),
    "correct": Case(
        "text",
        1,
        {"rate", "cases", "corrupted_words", "restored", "changed_correct", "acceptance"}
        | {"suspects", "margin", "rounds"},
        {"rates": [0.15], "rounds": 1},
    ),
    "constrain": Case(
        "text",
        1,
        {"kind", "cases", "acceptance", "matches_original", "accepted_ppl"},
        {"kinds": ["contain"]},  # met by construction: a scored row whatever the network
    ),
    "plan": Case("plan", 1, {"game", "cases", "solve_rate", "cells_correct", "answers"}),
    "write": Case(
        "text",
        1,
        {"samples", "entropy", "reference_entropy", "gen_ppl", "reference_ppl"},
        {"samples": 2},
    ),
}
CONFIGS = sorted(p.stem for p in (config_dir() / "task").glob("*.yaml"))


def untrained(process, tokenizer) -> Model:
    torch.manual_seed(0)
    network = Transformer(
        **process.network_kwargs, d_model=16, n_layers=1, n_heads=2, max_seq_len=L + 1
    )
    return Model(process.eval(), network.eval(), tokenizer, {"seq_len": L})


@pytest.fixture(scope="module")
def text(tiny_masked_checkpoint, tiny_corpus):
    tiny = load_model(tiny_masked_checkpoint)
    return untrained(tiny.process, tiny.tokenizer), str(tiny_corpus)


@pytest.fixture(scope="module")
def puzzles(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan") / "plan.txt"
    lines = games.corpus("countdown", 40, 0)
    atomic_write_text(path, "\n\n".join(lines) + "\n")
    tok = corpus_bpe([Document(path.read_text(), "plan")], vocab_size=300)
    process = MaskedProcess(len(tok), mask_id=tok.mask_token_id, eos_id=tok.eos_token_id)
    return untrained(process, tok), str(path)


def test_every_task_config_has_a_case():
    assert set(CONFIGS) == set(CASES), (
        f"conf/task without a contract row: {sorted(set(CONFIGS) - set(CASES))}; rows without "
        f"a config: {sorted(set(CASES) - set(CONFIGS))}"
    )


def takes(fn, protocol) -> None:
    """``fn`` accepts the call ``protocol`` describes: its positional-only parameters by place,
    its keyword-only ones by name, and nothing else it lacks a default for."""
    params = list(inspect.signature(protocol.__call__).parameters.values())[1:]
    places = [p.name for p in params if p.kind is p.POSITIONAL_ONLY]
    names = dict.fromkeys(p.name for p in params if p.kind is p.KEYWORD_ONLY)
    try:
        inspect.signature(fn).bind(*places, **names)
    except TypeError as e:
        pytest.fail(f"{fn} cannot be called as {protocol.__name__}: {e}")


@pytest.mark.parametrize("name", CONFIGS)
def test_a_task_config_builds_its_task_of_the_one_signature(name):
    task = named_task(name)
    assert task.name == name  # the report's and the file's name: conf/task/<name>.yaml
    takes(task.run, TaskRun)
    takes(task.read, Reader)
    assert set(task.options) <= set(inspect.signature(task.run).parameters)


@pytest.mark.parametrize("name", CONFIGS)
def test_a_task_reports_the_contract_keys(name, request):
    case = CASES[name]
    model, data = request.getfixturevalue("puzzles" if case.model == "plan" else "text")
    task = named_task(name, **case.options)
    scorer = Scorer(UniformLM(50), CharTokenizer(), "uniform-50") if task.scored else None
    result = suite.report(
        task,
        model,
        default_sampler(model.process),
        steps=2,
        seed=0,
        cases=2,
        scorer=scorer,
        data_path=data,
        val_fraction=0.1,
        load_seconds=0.0,
    )
    assert set(result) == REPORT and result["task"] == name
    assert set(result["input_length"]) == {"min", "median", "max"}
    assert len(result["rows"]) == case.rows
    for row in result["rows"]:
        assert set(row) == WORK | case.figures, sorted(set(row) ^ (WORK | case.figures))
        assert row["task"] == name and row["nfe"] >= 1
