"""``task=plan``: Sudoku and Countdown, the planning tasks where the field reports diffusion far
ahead of AR (Ye et al., ICLR 2025). Both are generated offline and checked exactly.

A puzzle is one line, ``prompt SEP answer``, so that a model trains on the lines as text (one
line per sequence, ``data.packing=false``) and is asked to write the answer after the prompt:
- Sudoku: the 81 cells (0 for a blank) ``=`` the blanks' digits in reading order. Any completion
  that obeys the rules and keeps the givens is solved, not only the generator's.
- Countdown: four numbers ``>`` a target ``:`` three equations, each combining two numbers still
  available (the given ones, or earlier results) into a new one, all four used, ending at the
  target.
Both processes are given the reference answer's length in tokens, as a fixed canvas.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from cdlm.generation import Plan
from cdlm.generation.inputs import fill_id
from cdlm.likelihood.evaluate import validation_tokens
from cdlm.model_file import Model
from cdlm.rng import member_seed
from cdlm.tasks.passages import word_ids
from cdlm.tasks.runs import CaseRuns, canvas, run_cases

GAMES = ("sudoku", "countdown")
SEPARATOR = {"sudoku": " =", "countdown": " :"}
EQUATION = re.compile(r"^\s*(\d+)\s*([-+*/])\s*(\d+)\s*=\s*(\d+)\s*$")


@dataclass(frozen=True)
class Puzzle:
    game: str
    prompt: str  # up to and including the separator
    answer: str  # the reference answer, with the space before it

    @property
    def line(self) -> str:
        return self.prompt + self.answer


def parse(line: str) -> Puzzle:
    """The puzzle a corpus line holds, whichever game it is; a clear error if it is none."""
    for game in GAMES:
        head, sep, answer = line.partition(SEPARATOR[game])
        puzzle = Puzzle(game, head + sep, answer)
        if sep and _well_formed(puzzle):
            return puzzle
    raise ValueError(
        f"{line[:60]!r} is neither a Sudoku nor a Countdown line; task=plan reads the held-out "
        "lines of data.path=<the puzzle file the model trained on> (scripts/plan_data.py)"
    )


def _well_formed(p: Puzzle) -> bool:
    if p.game == "sudoku":
        cells = p.prompt[: -len(SEPARATOR["sudoku"])].split()
        return len(cells) == 81 and all(c in "0123456789" and len(c) == 1 for c in cells)
    head = p.prompt[: -len(SEPARATOR["countdown"])]
    numbers, _, target = head.partition(" > ")
    return bool(target.strip().isdigit() and numbers.split() and numbers.replace(" ", "").isdigit())


def solved(p: Puzzle, answer: str) -> bool:
    """The exact checker: ``answer`` solves ``p`` (whatever the reference answer is)."""
    if p.game == "sudoku":
        return _sudoku_solved([int(c) for c in p.prompt.split()[:81]], answer)
    head = p.prompt[: -len(SEPARATOR["countdown"])]
    numbers, _, target = head.partition(" > ")
    return _countdown_solved([int(n) for n in numbers.split()], int(target), answer)


def _sudoku_solved(cells: list[int], answer: str) -> bool:
    digits = answer.split()
    if len(digits) != cells.count(0) or not all(d in "123456789" and len(d) == 1 for d in digits):
        return False
    fill = iter(int(d) for d in digits)
    grid = [c or next(fill) for c in cells]
    full = set(range(1, 10))
    rows = [grid[9 * r : 9 * r + 9] for r in range(9)]
    cols = [grid[c::9] for c in range(9)]
    boxes = [
        [grid[9 * (3 * br + r) + 3 * bc + c] for r in range(3) for c in range(3)]
        for br in range(3)
        for bc in range(3)
    ]
    return all(set(unit) == full for unit in rows + cols + boxes)


def cells_correct(p: Puzzle, answer: str) -> float:
    """Partial credit, 1.0 exactly when ``solved``: for Sudoku the share of blanks whose digit
    appears once in its row, column and box of the filled grid; for Countdown the share of the
    three steps that are right, each read in turn as ``solved`` reads it (its two numbers still
    available, its arithmetic exact), ending at the target counted as the last step's part."""
    if p.game == "sudoku":
        cells = [int(c) for c in p.prompt.split()[:81]]
        digits = [int(d) if d in "123456789" and len(d) == 1 else 0 for d in answer.split()]
        blanks = [i for i, c in enumerate(cells) if c == 0]
        grid = list(cells)
        for i, d in zip(blanks, digits, strict=False):
            grid[i] = d
        units = [[9 * r + c for c in range(9)] for r in range(9)]
        units += [[9 * r + c for r in range(9)] for c in range(9)]
        units += [[9 * (3 * (b // 3) + r) + 3 * (b % 3) + c for r in range(3) for c in range(3)]
                  for b in range(9)]  # fmt: skip
        of = {i: [u for u in units if i in u] for i in blanks}
        ok = [grid[i] and all([grid[j] for j in u].count(grid[i]) == 1 for u in of[i])
              for i in blanks]  # fmt: skip
        return sum(map(bool, ok)) / len(blanks)
    numbers, _, target = p.prompt[: -len(SEPARATOR["countdown"])].partition(" > ")
    pool, right = Counter(int(n) for n in numbers.split()), 0
    steps = len(numbers.split()) - 1
    for k, eq in enumerate(answer.split(",")[:steps]):
        m = EQUATION.match(eq)
        if m is None:
            continue
        a, op, b, c = int(m[1]), m[2], int(m[3]), int(m[4])
        held = pool[a] >= 1 + (a == b) and pool[b] >= 1
        if held and _apply(a, op, b) == c and (k < steps - 1 or c == int(target)):
            pool[a], pool[b], pool[c] = pool[a] - 1, pool[b] - 1, pool[c] + 1
            right += 1
    return right / steps


def _apply(a: int, op: str, b: int) -> int | None:
    if op == "+":
        return a + b
    if op == "-":
        return a - b if a > b else None
    if op == "*":
        return a * b
    return a // b if b and a % b == 0 else None


def _countdown_solved(numbers: list[int], target: int, answer: str) -> bool:
    pool = Counter(numbers)
    equations = answer.split(",")
    for eq in equations:
        m = EQUATION.match(eq)
        if m is None:
            return False
        a, op, b, c = int(m[1]), m[2], int(m[3]), int(m[4])
        pool[a] -= 1
        pool[b] -= 1
        if pool[a] < 0 or pool[b] < 0 or _apply(a, op, b) != c:
            return False
        pool[c] += 1
    left = [n for n, k in pool.items() for _ in range(k)]
    return left == [target] and len(equations) == len(numbers) - 1


def sudoku(rng: random.Random, blanks: tuple[int, int] = (20, 40)) -> Puzzle:
    """A random valid grid (a base pattern under the symmetries that keep it valid: digits
    relabelled, rows within bands, bands, columns within stacks, stacks) with a uniform number
    of cells in ``blanks`` blanked."""

    def order() -> list[int]:
        bands = rng.sample(range(3), 3)
        return [3 * b + r for b in bands for r in rng.sample(range(3), 3)]

    digits = rng.sample(range(1, 10), 9)
    rows, cols = order(), order()
    grid = [digits[(3 * (r % 3) + r // 3 + c) % 9] for r in rows for c in cols]
    hidden = set(rng.sample(range(81), rng.randint(*blanks)))
    cells = " ".join("0" if i in hidden else str(v) for i, v in enumerate(grid))
    answer = " ".join(str(grid[i]) for i in sorted(hidden))
    return Puzzle("sudoku", cells + SEPARATOR["sudoku"], " " + answer)


def countdown(rng: random.Random, size: int = 4, largest: int = 50) -> Puzzle:
    """``size`` numbers in 1..``largest`` combined in a random order by random operations (no
    negative or fractional results, none above 999); the last result is the target."""
    while True:
        numbers = [rng.randint(1, largest) for _ in range(size)]
        pool, equations = list(numbers), []
        while len(pool) > 1:
            a, b = (pool.pop(rng.randrange(len(pool))) for _ in range(2))
            a, b = max(a, b), min(a, b)
            op = rng.choice("+-*/")
            c = _apply(a, op, b)
            if c is None or c > 999:
                break
            equations.append(f"{a}{op}{b}={c}")
            pool.append(c)
        if len(pool) == 1 and len(equations) == size - 1:
            head = " ".join(map(str, numbers)) + f" > {pool[0]}"
            return Puzzle("countdown", head + SEPARATOR["countdown"], " " + " , ".join(equations))


def corpus(game: str, count: int, seed: int) -> list[str]:
    """``count`` distinct puzzle lines of ``game``: a model's training file (its last lines are
    the held-out split, never seen in training since no line repeats)."""
    if game not in GAMES:
        raise ValueError(f"unknown plan game {game!r}; choose one of {GAMES}")
    make: Callable[[random.Random], Puzzle] = {"sudoku": sudoku, "countdown": countdown}[game]
    rng, lines = random.Random(seed), {}
    while len(lines) < count:
        lines.setdefault(make(rng).line, None)
    return list(lines)


def held_out(
    model: Model, count: int, seed: int, data_path: str | None, val_fraction: float
) -> list[Puzzle]:
    """``count`` held-out puzzles (one line per validation sequence), chosen by ``seed``."""
    tokens = validation_tokens(model, data_path, val_fraction, packing=False)
    tok = model.tokenizer
    rows = random.Random(seed).sample(range(len(tokens)), min(count, len(tokens)))
    lines = [tok.decode([t for t in tokens[r].tolist() if t != tok.pad_token_id]) for r in rows]
    return [parse(line.split(tok.eos_token)[0]) for line in lines]


def run(
    model: Model,
    sampler: Callable,
    puzzles: list[Puzzle],
    *,
    steps: int,
    seed: int,
    scorer: object = None,
) -> list[dict]:
    """One row per game: the share of puzzles solved, each answer's canvas the reference
    answer's length."""
    del scorer  # judged by the checker alone
    tok, fill = model.tokenizer, fill_id(model.tokenizer)
    plans, heads = [], []
    for i, p in enumerate(puzzles):
        head, answer = word_ids(tok, p.prompt), word_ids(tok, p.answer)
        editable = [False] * len(head) + [True] * len(answer)
        layout = canvas(head + answer, editable, fill)
        plans.append(
            Plan(1, len(editable), steps, member_seed(seed, i), layout=layout, cut_at_eos=False)
        )
        heads.append(len(head))
    runs = run_cases(model, sampler, plans)
    answers = [
        tok.decode(g.samples[0].token_ids[n:], skip_special_tokens=True)
        for g, n in zip(runs.generations, heads, strict=True)
    ]
    wins = [solved(p, a) for p, a in zip(puzzles, answers, strict=True)]
    cells = [cells_correct(p, a) for p, a in zip(puzzles, answers, strict=True)]
    rows = []
    for game in sorted({p.game for p in puzzles}):
        mine = [i for i, p in enumerate(puzzles) if p.game == game]
        part = CaseRuns([runs.generations[i] for i in mine], [runs.stats[i] for i in mine], 0.0)
        row = {
            "game": game,
            "cases": len(mine),
            "solve_rate": sum(wins[i] for i in mine) / len(mine),
            "cells_correct": sum(cells[i] for i in mine) / len(mine),
            "answers": [answers[i] for i in mine],
        }
        rows.append(row | part.work() | {"warmup_s": runs.warmup_seconds})
    return rows
