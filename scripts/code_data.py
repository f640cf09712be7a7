"""Issue 25's code corpus: the Python standard library's own source (on every machine), its
top-level modules in a seeded order, concatenated into one ``.py`` training file (so it is read
line by line, indentation kept; the held-out split is its last lines).

usage: python scripts/code_data.py OUT.py [--megabytes 4] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import sysconfig
from pathlib import Path

from cdlm.io import atomic_write_text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--megabytes", type=float, default=4.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    random.Random(args.seed).shuffle(files)
    parts, size = [], 0
    for f in files:
        text = f.read_text(encoding="utf-8", errors="replace")
        if size + len(text) > args.megabytes * 1e6:
            continue
        parts.append(text)
        size += len(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, "\n".join(parts))
    print(f"wrote {len(parts)} modules ({size / 1e6:.1f} MB) to {args.out}")


if __name__ == "__main__":
    main()
