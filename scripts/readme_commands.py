"""The README's two commands, read from README.md itself so that CI runs them as written.

    python scripts/readme_commands.py quickstart   # the first fenced bash block
    python scripts/readme_commands.py test         # the second: install and run the tests

.ci/run runs what ``test`` prints; tests/test_readme_ci.py checks that it does and that each
block is one command line.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
NAMES = ("quickstart", "test")
_BLOCK = re.compile(r"^```bash\n(.*?)\n```", re.MULTILINE | re.DOTALL)


def commands(text: str) -> dict[str, str]:
    """The first two fenced bash blocks of ``text`` as {quickstart, test}; each must be one
    line, since a reader copies it whole."""
    blocks = _BLOCK.findall(text)[: len(NAMES)]
    if len(blocks) < len(NAMES):
        raise ValueError(f"README.md needs {len(NAMES)} fenced bash blocks, found {len(blocks)}")
    for name, block in zip(NAMES, blocks, strict=True):
        if "\n" in block.strip():
            raise ValueError(f"README.md's {name} command must be one line")
    return {name: block.strip() for name, block in zip(NAMES, blocks, strict=True)}


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in NAMES:
        raise SystemExit(f"usage: readme_commands.py {'|'.join(NAMES)}")
    print(commands(README.read_text())[sys.argv[1]])
