"""cdlm uses Lightning's public API only (issue 42): a private attribute of a Lightning object
(``ema._average_model`` in the distillation rounds was one) breaks silently on an upgrade.

Two AST scans of cdlm/. First, no access to the known private names of the Lightning objects
cdlm touches, and no ``_name`` read off a name that conventionally holds one (``trainer._x``,
``pl_module._x``, ``self.trainer._x``); it cannot know every object's type, so it catches the
forms that have occurred and the ones a hook's arguments invite. Second, a class deriving from a
Lightning class neither overrides nor uses (``self._x``, ``super()._x``) a private member of its
Lightning bases: the names ``dir()`` lists on them, and the attributes their own code sets on
``self`` (``ModelCheckpoint._last_checkpoint_saved`` is set in ``__init__``, so ``dir()`` of the
class does not list it). ``cdlm.training.resume.Checkpoint`` once did both."""

import ast
import importlib
import inspect
import textwrap
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


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def lightning_bases(cls: type) -> list[type]:
    return [
        b for b in cls.__mro__ if b.__module__.split(".")[0] in ("lightning", "pytorch_lightning")
    ]


def private_members(cls: type) -> set[str]:
    """The private names of ``cls``'s Lightning bases (with what they inherit, torch's included)."""
    names = set()
    for base in lightning_bases(cls):
        names |= {n for n in dir(base) if is_private(n)}
        try:
            source = textwrap.dedent(inspect.getsource(base))
        except (OSError, TypeError):
            continue
        names |= {
            node.attr
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
            and is_private(node.attr)
        }
    return names


def is_self_or_super(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return isinstance(node, ast.Call) and getattr(node.func, "id", None) == "super"


def subclass_uses(node: ast.ClassDef, cls: type) -> list[str]:
    """``line: what`` for each private member of a Lightning base that ``cls`` (defined by
    ``node``) overrides or uses."""
    private = private_members(cls)
    found = []
    for item in node.body:
        defined = [item.name] if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) else []
        if isinstance(item, ast.Assign | ast.AnnAssign):
            targets = item.targets if isinstance(item, ast.Assign) else [item.target]
            defined = [t.id for t in targets if isinstance(t, ast.Name)]
        found += [f"{item.lineno}: overrides {name}" for name in defined if name in private]
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr in private and is_self_or_super(sub.value):
            found.append(f"{sub.lineno}: {ast.unparse(sub)}")
    return found


def test_the_subclass_scan_finds_private_overrides_and_uses():
    source = textwrap.dedent(
        """
        from lightning.pytorch.callbacks import ModelCheckpoint

        class Saver(ModelCheckpoint):
            def _save_checkpoint(self, trainer, filepath):
                super()._save_checkpoint(trainer, filepath)
                self._last_checkpoint_saved = filepath
            def on_train_batch_end(self, trainer, *args):
                if not self._should_skip_saving_checkpoint(trainer):
                    self._own_helper(self._monitor_candidates(trainer))
            def _own_helper(self, candidates):
                self._mine = candidates  # allowed: cdlm's own private names
                return self.format_checkpoint_name(candidates)  # allowed: public
        """
    )
    namespace = {}
    exec(compile(source, "saver", "exec"), namespace)
    node = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef))
    assert sorted(int(u.split(":")[0]) for u in subclass_uses(node, namespace["Saver"])) == [
        5,
        6,
        7,
        9,
        10,
    ]


def test_cdlm_subclasses_use_no_private_lightning_member():
    uses, checked = {}, 0
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent).with_suffix("")
        module = importlib.import_module(".".join(relative.parts).removesuffix(".__init__"))
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            cls = getattr(module, node.name, None)  # a class nested in a function is not reached
            if isinstance(cls, type) and lightning_bases(cls):
                checked += 1
                if found := subclass_uses(node, cls):
                    uses[f"{relative}.{node.name}"] = found
    assert checked >= 10  # the callbacks, modules and datamodule of cdlm/training and beyond
    assert not uses, f"use Lightning's public API (hooks, properties) instead: {uses}"
