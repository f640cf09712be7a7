"""cdlm uses Lightning's public API only (issue 42): a private attribute of a Lightning object
(``ema._average_model`` in the distillation rounds was one) breaks silently on an upgrade.

A plain AST scan of cdlm/: no access to the known private names of the Lightning objects cdlm
touches, and no ``_name`` read off a name that conventionally holds one (``trainer._x``,
``pl_module._x``, ``self.trainer._x``). It cannot know every object's type; it catches the
forms that have occurred and the ones a hook's arguments invite."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "cdlm"

# WeightAveraging's average and its bookkeeping, LightningModule's trainer, the EMA's name.
PRIVATE = {
    "_average_model",
    "_swap_models",
    "_copy_average_to_current",
    "_latest_update_step",
    "_latest_update_epoch",
    "_ema",
    "_trainer",
}
# Names that hold Lightning objects in hooks and callbacks.
LIGHTNING = {"trainer", "pl_module", "callback", "ema", "strategy", "lightning_module"}


def receiver(node: ast.expr) -> str | None:
    """The name an attribute is read off: ``trainer`` for ``trainer._x`` and ``self.trainer._x``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def private_uses(source: str) -> list[str]:
    """``line: expression`` for each private Lightning access in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        name = None
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            if not node.attr.startswith("__") and (
                node.attr in PRIVATE or receiver(node.value) in LIGHTNING
            ):
                name = node.attr
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in (
            "getattr",
            "setattr",
            "hasattr",
        ):
            literal = node.args[1] if len(node.args) > 1 else None
            if isinstance(literal, ast.Constant) and literal.value in PRIVATE:
                name = literal.value
        if name is not None:
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_scan_finds_the_forms_it_forbids():
    source = "\n".join(
        [
            "ema._average_model.module",
            "self.rounds.ema._average_model.n_averaged.zero_()",
            "trainer._checkpoint_connector",
            "self.trainer._results",
            "pl_module._denoisers(batch)",
            "getattr(found, '_average_model', None)",
            "self._trainer",
            # allowed: public names, cdlm's own private helpers, dunders
            "ema.on_train_end(trainer, module)",
            "self._denoisers(batch)",
            "trainer.__class__",
        ]
    )
    assert sorted(int(u.split(":")[0]) for u in private_uses(source)) == [1, 2, 3, 4, 5, 6, 7]


def test_cdlm_reads_no_private_lightning_attribute():
    uses = {
        str(path.relative_to(PACKAGE)): found
        for path in sorted(PACKAGE.rglob("*.py"))
        if (found := private_uses(path.read_text(encoding="utf-8")))
    }
    assert not uses, f"use Lightning's public API (hooks, properties) instead: {uses}"
