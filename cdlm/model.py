"""The in-memory cdlm model (process, network, tokenizer, the configs that rebuild them) and
the pickle-free file it writes; ``cdlm.model_file`` reads such files back.

Files are written to a temporary name and renamed, so a crash never leaves half a checkpoint
behind. ``Model.save_pretrained`` puts the file in a folder with the Hub's companions
(``cdlm.hub``).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from safetensors.torch import save_file
from torch import nn

from cdlm import hub
from cdlm.data.tokenizer import serialise
from cdlm.io import atomic_path

FORMAT = "cdlm-1"


class ModelFileError(ValueError):
    """A checkpoint is missing, unreadable or not a cdlm model file."""


@dataclass
class Model:
    """Everything sampling needs: process, network, tokenizer and the stored configs; ``facts``:
    the model card's (training, measured figures) when loaded from a model folder."""

    process: nn.Module
    network: nn.Module
    tokenizer: Any
    config: dict[str, Any]
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def denoiser(self):
        return self.process.make_denoiser(self.network)

    def card_facts(self) -> dict[str, Any]:
        """The card's facts: what the model says about itself, then what was recorded."""
        modules = (self.process, self.network)
        n = sum(p.numel() for m in modules for p in m.parameters())
        own = {"process": self.process.kind, "parameters": n, "vocab": len(self.tokenizer)}
        own["sampler"] = self.process.default_sampler
        return own | self.facts

    def save_pretrained(self, folder: str | Path, ref: str | None = None) -> Path:
        """Writes the Hub layout into ``folder``: ``model.safetensors``, ``config.json``, the
        tokenizer files and the ``README.md`` model card (``ref`` names the model in its
        commands; default the folder). Returns the folder."""
        folder = Path(folder)
        save_model(folder / hub.WEIGHTS, self)
        hub.write_companions(folder, self.config, self.tokenizer, self.card_facts(), ref)
        return folder

    def push_to_hub(self, repo_id: str, *, token: str | None = None, private: bool = False) -> str:
        """Uploads the model to the Hugging Face Hub as ``repo_id`` (through
        ``huggingface_hub.HfApi``); returns the commit URL."""
        with tempfile.TemporaryDirectory() as tmp:
            self.save_pretrained(tmp, ref=repo_id)
            return hub.push_folder(tmp, repo_id, token=token, private=private)


def save_model(path: str | Path, model: Model) -> None:
    """Writes ``model`` as one pickle-free file; a world's oracle is refused (it is its world:
    ``ckpt=world:<name>`` rebuilds it, and its network has no weights to store)."""
    if model.config.get("world") and "world" in model.config.get("network", {}):
        raise ModelFileError(
            f"a world model is not saved: load it again with ckpt={model.config['world']}"
        )
    path = Path(path)
    state = {f"process.{k}": v for k, v in model.process.state_dict().items()}
    state |= {f"network.{k}": v for k, v in model.network.state_dict().items()}
    state = {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}
    tok_json, specials = serialise(model.tokenizer)
    metadata = {
        "format": FORMAT,
        "config": json.dumps(model.config),
        "tokenizer": tok_json,
        "special_tokens": json.dumps(specials),
    }
    with atomic_path(path) as tmp:
        save_file(state, str(tmp), metadata=metadata)


def build(path: Path, config: dict[str, Any], part: str) -> nn.Module:
    """The stored ``part`` config instantiated; one this cdlm cannot build (a file written by
    another version, say) is named in one line."""
    if not isinstance(config.get(part), dict):
        raise ModelFileError(f"{path}: its config has no {part} (a damaged file?)")
    try:
        built = instantiate(config[part])
    except InstantiationException as e:
        cause = " ".join(str(e.__cause__ or e).split())
        raise ModelFileError(
            f"{path}: its {part} config does not fit this version of cdlm: {cause}"
        ) from None
    if not isinstance(built, nn.Module):  # no _target_: instantiate hands the dict back
        raise ModelFileError(f"{path}: its {part} config names no class (a damaged file?)")
    return built


def qualname(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"
