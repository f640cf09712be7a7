"""docs/guide/architecture.md names every module of the package in its module tree, so the map stays
whole as modules come and go."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_tree() -> str:
    doc = (ROOT / "docs" / "guide" / "architecture.md").read_text()
    start = doc.index("```\ncdlm/\n")
    return doc[start : doc.index("```", start + 4)]


def test_every_module_is_on_the_map():
    tree = module_tree()
    missing = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "cdlm").rglob("*.py"))
        if path.name != "__init__.py" and not re.search(rf"\b{re.escape(path.stem)}\b", tree)
    ]
    assert not missing, f"add these to docs/guide/architecture.md's module tree: {missing}"
