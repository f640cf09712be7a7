"""``cdlm-table FOLDER [FOLDER ...]``: one table of every ``cdlm-train`` and ``cdlm-eval`` job
under the folders, a row per job with its overrides, metrics, steps, cost and commit
(``cdlm.run.table``); writes ``table.json`` and ``table.md`` (``--out PREFIX``) and prints the
markdown. docs/guide/sweeps.md."""

from __future__ import annotations

import argparse
from pathlib import Path

from cdlm.cli.common import fail
from cdlm.run.table import collect, write


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="cdlm-table", description=__doc__)
    parser.add_argument("folders", type=Path, nargs="+", help="multirun or run folders")
    parser.add_argument("--out", type=Path, help="PREFIX: writes PREFIX.json and PREFIX.md")
    parser.add_argument("--metrics", nargs="+", help="the metrics the markdown shows (JSON: all)")
    args = parser.parse_args(argv)
    missing = [str(f) for f in args.folders if not f.is_dir()]
    if missing:
        fail("cdlm-table", f"no such folder: {', '.join(missing)}")
    try:
        table = collect(args.folders)
    except FileNotFoundError as e:
        fail("cdlm-table", str(e))
    print(write(table, args.out or args.folders[0] / "table", args.metrics), end="")


if __name__ == "__main__":
    main()
