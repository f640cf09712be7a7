"""cdlm: continuous and discrete diffusion language models."""

from pathlib import Path

__version__ = "0.1.0"


def config_dir() -> Path:
    """The Hydra config folder: ``cdlm/conf`` inside an installed wheel, else the repository's
    top-level ``conf/`` (source checkouts and editable installs)."""
    packaged = Path(__file__).parent / "conf"
    if (packaged / "train.yaml").is_file():
        return packaged
    return Path(__file__).resolve().parent.parent / "conf"
