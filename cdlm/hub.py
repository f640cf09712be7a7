"""The Hugging Face layout of a model folder, and moving it to and from the Hub.

A cdlm model folder is what ``Model.save_pretrained`` and ``cdlm-train`` write:

- ``model.safetensors``: the self-contained, pickle-free model file (``cdlm.model_file``), the
  one thing loading reads; it stays usable alone (``ckpt=folder/model.safetensors``);
- ``config.json``: the same configs, readable, plus the model card's facts (``card``);
- ``tokenizer.json`` and ``tokenizer_config.json``: so ``AutoTokenizer.from_pretrained(folder)``
  loads the tokenizer without cdlm;
- ``README.md``: the model card (``cdlm.card``), re-rendered whenever its facts change.

Downloads fetch only these files (no pickle can arrive), and uploads go through
``huggingface_hub.HfApi``.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from huggingface_hub import CommitOperationAdd, HfApi

from cdlm.card import render_card
from cdlm.io import atomic_write_text

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
CARD = "README.md"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
HUB_FILES = (CONFIG, WEIGHTS, *TOKENIZER_FILES, CARD)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
_FILE_SUFFIXES = (".safetensors", ".ckpt", ".pt", ".pth", ".bin", ".json")


class HubError(ValueError):
    """A model folder or Hub repository that cannot be read or written."""


def is_hub_id(ref: str) -> bool:
    """True for ``owner/name`` that is not a local path (nor a file name such as
    ``run/model.safetensors``): the only refs that are looked up on the Hub."""
    ref = str(ref)
    return (
        not Path(ref).expanduser().exists()
        and _HUB_ID.match(ref) is not None
        and not ref.endswith(_FILE_SUFFIXES)
    )


def resolve(ref: str | Path, revision: str | None = None) -> Path:
    """A local path as it is; a Hub id downloaded (the Hub files only) into the HF cache."""
    if not is_hub_id(str(ref)):
        return Path(str(ref)).expanduser()
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(str(ref), revision=revision, allow_patterns=list(HUB_FILES))
    except Exception as e:  # offline, unknown repo, no access: one message for all
        raise HubError(
            f"{ref} is not a local path, and the Hugging Face Hub did not give it: "
            f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
        ) from None
    return Path(folder)


def weights_path(path: Path) -> Path:
    """The model file of a folder, or the path itself."""
    return path / WEIGHTS if path.is_dir() else path


def read_config(folder: Path) -> dict[str, Any]:
    """A folder's ``config.json`` (empty when absent: a bare model file has none)."""
    path = folder / CONFIG
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def model_part(config: dict[str, Any]) -> dict[str, Any]:
    """The model's configs in a ``config.json`` (without the card and library keys)."""
    return {k: v for k, v in config.items() if k not in ("library_name", "card")}


def save_tokenizer(tokenizer, folder: Path) -> None:
    """``tokenizer.json`` + ``tokenizer_config.json``, naming the class every transformers
    version knows (transformers 5 writes its own new backend class name otherwise)."""
    with tempfile.TemporaryDirectory(dir=folder, prefix=".tokenizer.", suffix=".tmp") as tmp:
        tokenizer.save_pretrained(tmp)
        settings = Path(tmp) / "tokenizer_config.json"
        data = json.loads(settings.read_text(encoding="utf-8"))
        data["tokenizer_class"] = "PreTrainedTokenizerFast"
        data.pop("backend", None)
        settings.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        for name in TOKENIZER_FILES:
            if (Path(tmp) / name).is_file():
                os.replace(Path(tmp) / name, folder / name)


def write_companions(
    folder: str | Path, config: dict, tokenizer, facts: dict, ref: str | None = None
) -> None:
    """Writes ``config.json``, the tokenizer files and ``README.md`` beside the model file.
    ``ref`` names the model in the card's commands (default: the folder)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_tokenizer(tokenizer, folder)
    write_card(folder, config, facts, ref)


def write_card(folder: Path, config: dict, facts: dict, ref: str | None = None) -> None:
    """``config.json`` (configs + facts) and the ``README.md`` rendered from them."""
    data = {"library_name": "cdlm", **model_part(config), "card": facts}
    atomic_write_text(folder / CONFIG, json.dumps(data, indent=2) + "\n")
    atomic_write_text(folder / CARD, render_card(model_part(config), facts, ref or str(folder)))


def record_metrics(folder: str | Path, metrics: dict, ref: str | None = None) -> bool:
    """Replaces the card's measured figures of a model folder (``cdlm-eval``); False (nothing
    written) when ``folder`` has no ``config.json`` (a bare model file)."""
    folder = Path(folder)
    config = read_config(folder)
    if not config:
        return False
    facts = config.get("card", {}) | {"metrics": metrics}
    write_card(folder, config, facts, ref)
    return True


def record_metrics_of(ckpt: str, metrics: dict) -> Path | None:
    """``record_metrics`` for the model folder that ``ckpt`` is or sits in; the card written,
    or None (a Hub id, a world, a bare model file)."""
    if is_hub_id(ckpt) or not Path(ckpt).exists():
        return None
    path = Path(ckpt)
    folder = path if path.is_dir() else path.parent
    return folder / CARD if record_metrics(folder, metrics) else None


def push_folder(
    folder: str | Path,
    repo_id: str,
    *,
    token: str | None = None,
    private: bool = False,
    revision: str | None = None,
    message: str = "Upload cdlm model",
) -> str:
    """Uploads a model folder's Hub files (nothing else of a run folder: no Lightning
    checkpoints, no logs) as one commit, the card re-rendered to name ``repo_id``; returns the
    commit's URL."""
    folder = Path(folder)
    if not (folder / WEIGHTS).is_file():
        raise HubError(f"{folder} has no {WEIGHTS}: not a model folder")
    config = read_config(folder)
    operations = [
        CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(folder / name))
        for name in HUB_FILES
        if name != CARD and (folder / name).is_file()
    ]
    if config:
        card = render_card(model_part(config), config.get("card", {}), repo_id)
        operations.append(CommitOperationAdd(path_in_repo=CARD, path_or_fileobj=card.encode()))
    api = HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True)
    info = api.create_commit(
        repo_id, operations=operations, commit_message=message, revision=revision
    )
    return str(getattr(info, "commit_url", info))
