"""Issue 25's planning corpus: Sudoku and Countdown puzzle lines (``cdlm.tasks.games``), shuffled
together into one training file whose last lines are the held-out puzzles of ``task=plan``.

``--format pairs`` writes the same puzzles in the same order as ``data.format=pairs`` JSONL (the
puzzle as ``prompt``, its solution as ``response``: prompt→answer training, as Ye et al. train
them), so that a pairs file and a text file of one seed hold out the same puzzles.

usage: python scripts/plan_data.py OUT [--count 20000] [--seed 0] [--format text|pairs]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from cdlm.io import atomic_write_text
from cdlm.tasks import games


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--count", type=int, default=20_000, help="puzzles per game")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--format", choices=("text", "pairs"), default="text")
    args = parser.parse_args()
    lines = [line for g in games.GAMES for line in games.corpus(g, args.count, args.seed)]
    random.Random(args.seed).shuffle(lines)
    if args.format == "pairs":
        puzzles = (games.parse(line) for line in lines)
        rows = (json.dumps({"prompt": p.prompt, "response": p.answer}) for p in puzzles)
        text = "\n".join(rows) + "\n"
    else:
        text = "\n\n".join(lines) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, text)
    print(f"wrote {len(lines)} puzzles to {args.out}")


if __name__ == "__main__":
    main()
