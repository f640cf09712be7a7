"""task=constrain and task=plan: acceptance checks on hand-built passing and failing cases, the
puzzle generators against their exact checkers, and oracle models that must pass everything."""

from __future__ import annotations

import json
import random

import pytest
import torch
from torch import nn

from cdlm.data.corpus import Document, load_documents
from cdlm.data.tokenizer import corpus_bpe
from cdlm.generation.choice import named_sampler
from cdlm.io import atomic_write_text
from cdlm.model_file import Model
from cdlm.processes import MaskedProcess
from cdlm.tasks import constrain, constraint_kinds, games
from cdlm.tasks.passages import WORD, held_out, lay_out
from tests.conftest import TINY_TRAIN, run_main

L = 48


@pytest.fixture(scope="module")
def tok(tiny_corpus):
    return corpus_bpe(load_documents(str(tiny_corpus)), vocab_size=300)


class KnowsLines(nn.Module):
    """A masked model's network that recognises its sequence (among ``truths``, the one that
    agrees with the visible tokens most) and predicts its true tokens everywhere."""

    def __init__(self, truths: list[list[int]], vocab: int) -> None:
        super().__init__()
        self.truth = [torch.tensor(t) for t in truths]
        self.vocab, self.anchor = vocab, nn.Parameter(torch.zeros(()))

    def forward(self, z, t, self_cond=None, **kw):
        logits = torch.zeros(*z.shape, self.vocab)
        for row, seq in enumerate(z):
            fits = [p[: len(seq)] for p in self.truth if len(p) >= len(seq)]
            best = max(fits, key=lambda p: int((p == seq).sum()))
            logits[row, torch.arange(len(seq)), best] = 30.0
        return logits


def oracle_model(tok, truths: list[list[int]], seq_len: int) -> Model:
    process = MaskedProcess(len(tok), mask_id=tok.mask_token_id, eos_id=tok.eos_token_id).eval()
    return Model(process, KnowsLines(truths, len(tok)).eval(), tok, {"seq_len": seq_len})


def words(text: str) -> list[str]:
    return WORD.findall(text)


def test_text_constraints_accept_and_refuse_hand_built_fills(tok):
    p = lay_out(
        tok, words("Then Anne said. It was so very late by then that night. She went home.")
    )
    case = constraint_kinds._end_with(p)
    assert case is not None and p.words[case.end - 1] == " night."
    assert constraint_kinds.accepted(case, p.ids, tok)
    early = list(p.ids)  # a fill that closes its sentence before "night."
    a, b = p.spans[min(case.blank)]
    early[a:b] = tok(".")["input_ids"] * (b - a)
    assert not constraint_kinds.accepted(case, early, tok)
    p = lay_out(tok, words("Then Anne said it was late. She went home and Anne slept well."))
    case = constraint_kinds._name_twice(p)
    assert case is not None and {p.words[i] for i in case.blank} == {" Anne"}
    assert constraint_kinds.accepted(case, p.ids, tok)
    ids = list(p.ids)
    a, b = p.spans[max(case.blank)]
    ids[a:b] = lay_out(tok, [" Emma"]).ids if len(lay_out(tok, [" Emma"]).ids) == b - a else [0]
    assert not constraint_kinds.accepted(case, ids, tok)  # the two places disagree
    case = constraint_kinds._sentences(
        lay_out(tok, words("Oh. Mr. Knightley came. Emma smiled. Then."))
    )
    assert case is not None and case.count == 2  # "Mr." ends no sentence
    assert constraint_kinds.sentence_ends("Mr. Elton came. Harriet cried! Mrs. Goddard?") == 3


def test_code_constraints_check_syntax_and_the_shared_identifier(tok):
    lines = ["def f(total, step):", "    value = total + step", "    return value * value", "x"]
    p = lay_out(tok, words("\n".join(lines)))
    case = constraint_kinds._code_line(p)
    assert case is not None and constraint_kinds.accepted(case, p.ids, tok)
    broken = list(p.ids)
    a, b = p.spans[max(case.blank)]
    broken[a:b] = lay_out(tok, [" ("]).ids * (b - a)
    assert not constraint_kinds.accepted(case, broken, tok)
    case = constraint_kinds._code_name(p)
    assert case is not None and {p.words[i].strip() for i in case.blank} == {"value"}
    assert constraint_kinds.accepted(case, p.ids, tok)
    assert (
        constraint_kinds._code_line(lay_out(tok, words('x\n    """A docstring line."""\ny')))
        is None
    )


def test_an_oracle_meets_every_text_constraint(tok, tiny_corpus):
    bare = oracle_model(tok, [[0]], L)
    passages = held_out(bare, 12, L - 4, seed=1, data_path=str(tiny_corpus))
    model = oracle_model(tok, [p.ids for p in passages], L)
    rows = constrain.run(model, named_sampler("confidence"), passages, steps=4, seed=0, scorer=None)
    assert {r["kind"] for r in rows} <= set(constraint_kinds.TEXT_KINDS) and rows
    for r in rows:
        assert r["acceptance"] == r["matches_original"] == 1.0, r
        assert r["cases"] >= 1 and r["nfe"] >= 1
    with pytest.raises(ValueError, match="unknown constraint kind 'rhyme'"):
        constrain.make_cases(passages, "rhyme", tok)


def test_generated_puzzles_are_distinct_seeded_and_solved_by_their_answers():
    for game in games.GAMES:
        lines = games.corpus(game, 50, seed=4)
        assert len(set(lines)) == 50 and lines == games.corpus(game, 50, seed=4)
        for line in lines:
            p = games.parse(line)
            assert p.game == game and games.solved(p, p.answer)
    with pytest.raises(ValueError, match="unknown plan game"):
        games.corpus("chess", 1, 0)


def test_plan_checkers_refuse_wrong_answers():
    p = games.sudoku(random.Random(0))
    digits = p.answer.split()
    swapped = [digits[1], digits[0], *digits[2:]]
    assert digits[0] == digits[1] or not games.solved(p, " " + " ".join(swapped))
    assert not games.solved(p, " " + " ".join(digits[:-1]))  # a blank left
    assert not games.solved(p, " " + " ".join(["0", *digits[1:]]))
    p = games.parse("3 5 2 6 > 22 : 3+5=8 , 8*2=16 , 16+6=22")
    assert games.solved(p, p.answer)
    assert games.solved(p, " 6*3=18 , 18+2=20 , 20+5=25") is False  # misses the target
    assert not games.solved(p, " 3+5=8 , 8*2=16 , 16+5=21")  # 5 used twice
    assert not games.solved(p, " 3+5=9 , 9*2=18 , 18+4=22")  # wrong arithmetic
    assert not games.solved(p, " 3+5=8 , 8*2=16")  # 6 unused
    assert not games.solved(p, " 5-6=1 , 1*3=3 , 3*2=6")  # no negative steps
    with pytest.raises(ValueError, match="neither a Sudoku nor a Countdown"):
        games.parse("It is a truth universally acknowledged")


def test_cells_correct_gives_partial_credit_by_hand():
    full = games.sudoku(random.Random(1), blanks=(0, 0)).prompt.split()[:81]
    grid = [int(c) for c in full]
    cells = " ".join("0" if i in (0, 80) else str(v) for i, v in enumerate(grid))
    p = games.Puzzle("sudoku", cells + " =", f" {grid[0]} {grid[80]}")
    wrong = grid[80] % 9 + 1  # a digit given elsewhere in the last row: that cell breaks
    assert games.cells_correct(p, p.answer) == 1.0
    assert games.cells_correct(p, f" {grid[0]} {wrong}") == 0.5
    assert games.cells_correct(p, " 0 0") == games.cells_correct(p, "") == 0.0
    p = games.parse("3 5 2 6 > 22 : 3+5=8 , 8*2=16 , 16+6=22")
    assert games.cells_correct(p, p.answer) == 1.0
    assert games.cells_correct(p, " 3+5=8 , 8*2=16 , 16+5=21") == 2 / 3  # 5 used twice
    assert games.cells_correct(p, " 6*3=18 , 18+2=20 , 20+5=25") == 2 / 3  # misses the target
    assert games.cells_correct(p, " 3+5=9 , 9*2=18 , 18+4=22") == 0.0  # nothing follows
    assert games.cells_correct(p, " 3+5=8 , 8*2=16") == 2 / 3  # a step short


@pytest.fixture(scope="module")
def puzzles(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan") / "plan.txt"
    lines = games.corpus("sudoku", 60, 0) + games.corpus("countdown", 60, 0)
    random.Random(0).shuffle(lines)
    atomic_write_text(path, "\n\n".join(lines) + "\n")
    return path


def test_an_oracle_solves_every_held_out_puzzle_of_both_games(puzzles):
    tok = corpus_bpe([Document(puzzles.read_text(), "plan")], vocab_size=300)
    truths = [tok(line)["input_ids"] for line in puzzles.read_text().split("\n\n")]
    model = oracle_model(tok, truths, 128)
    held = games.held_out(model, 10, seed=0, data_path=str(puzzles), val_fraction=0.1)
    assert len(held) == 10 and all(line in puzzles.read_text() for line in (p.line for p in held))
    rows = games.run(model, named_sampler("confidence"), held, steps=8, seed=0)
    assert {r["game"] for r in rows} <= set(games.GAMES)
    assert sum(r["cases"] for r in rows) == 10
    assert all(r["solve_rate"] == r["cells_correct"] == 1.0 and r["nfe"] >= 1 for r in rows), rows


def train_masked(run_dir, corpus, *overrides: str) -> None:
    trained = run_main(
        "cdlm-train",
        f"data.path={corpus}",
        *[o for o in TINY_TRAIN if not o.startswith("data.seq_len")],
        "process=masked",
        *overrides,
        "+trainer.enable_progress_bar=false",
        f"hydra.run.dir={run_dir}",
        cwd=run_dir,
    )
    assert trained.returncode == 0, trained.stderr[-3000:]


def test_cdlm_eval_runs_constrain_and_plan(tiny_corpus, puzzles, tmp_path_factory):
    text, run_dir = tmp_path_factory.mktemp("text_run"), tmp_path_factory.mktemp("plan_run")
    train_masked(text, tiny_corpus, "data.seq_len=64")
    train_masked(run_dir, puzzles, "data.seq_len=128", "data.packing=false")
    for ckpt, task, extra in (
        (text, "constrain", [f"data.path={tiny_corpus}"]),
        (run_dir, "plan", [f"data.path={puzzles}"]),
    ):
        out = run_dir / f"{task}.json"
        result = run_main(
            "cdlm-eval",
            f"ckpt={ckpt}",
            f"task={task}",
            *extra,
            "cases=6",
            "steps=2",
            "scorer=none",
            f"out={out}",
            cwd=run_dir,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        report = json.loads(out.read_text())
        figure = {"constrain": "acceptance", "plan": "solve_rate"}[task]
        assert report["task"] == task and report["rows"]
        assert all({figure, "nfe", "positions", "wall_s_median"} <= set(r) for r in report["rows"])
    result = run_main(
        "cdlm-eval", f"ckpt={run_dir}", "task=plan", "cases=2", "scorer=none", cwd=run_dir
    )
    assert result.returncode != 0 and "neither a Sudoku nor a Countdown" in result.stderr
