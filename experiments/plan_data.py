"""Issue 25's planning corpus: Sudoku and Countdown puzzle lines (``cdlm.tasks.games``), shuffled
together into one training file whose last lines are the held-out puzzles of ``task=plan``.

usage: python experiments/plan_data.py OUT.txt [--count 20000] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from cdlm.io import atomic_write_text
from cdlm.tasks import games


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--count", type=int, default=20_000, help="puzzles per game")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    lines = [line for g in games.GAMES for line in games.corpus(g, args.count, args.seed)]
    random.Random(args.seed).shuffle(lines)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, "\n\n".join(lines) + "\n")
    print(f"wrote {len(lines)} puzzles to {args.out}")


if __name__ == "__main__":
    main()
