"""Self-contained, pickle-free model files, alone or in a Hugging Face model folder, read back.

A cdlm checkpoint is one ``.safetensors`` file (``cdlm.model.save_model``): the weights of the
process (embeddings) and the network, plus metadata holding the JSON configs that rebuild them
and the tokenizer JSON. Loading never unpickles anything, and only cdlm's own classes may be
instantiated from the stored configs (never a function such as ``torch.load``); a class that
has moved is found under its old name too (``MOVED``). Every loader here takes the file, a model folder or a Hub id;
``load_model`` also dispatches a pretrained causal LM (``cdlm.pretrained.base_model``) and a
world (``cdlm.world_model``), which build their models themselves.
"""

from __future__ import annotations

import json
import pydoc
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, safe_open
from torch import nn

from cdlm import hub, pretrained, worlds
from cdlm.data.tokenizer import wrap
from cdlm.model import FORMAT, Model, ModelFileError, build, save_model
from cdlm.world_model import oracle_model, world_model

ALLOWED_PREFIX = "cdlm."
# the record and its writer live in cdlm.model; callers read them here, beside the loaders
__all__ = ["FORMAT", "Model", "ModelFileError", "load_model", "oracle_model", "save_model"]


# Classes that moved since files were written, by the name those files record: the split of
# cdlm.processes.parameterization (issue 42). A file's config is read with today's names.
MOVED = {
    "cdlm.processes.parameterization.VectorInput": "cdlm.processes.inputs.VectorInput",
    "cdlm.processes.parameterization.PosteriorInput": "cdlm.processes.inputs.PosteriorInput",
}


def _allowed(target: str) -> bool:
    """Only a class of cdlm's own is built from a file: a function target (``torch.load``, a
    file writer) would run whatever the file asks, with the arguments it gives."""
    if not target.startswith(ALLOWED_PREFIX):
        return False
    try:
        found = pydoc.locate(target)
    except pydoc.ErrorDuringImport:
        return True  # build names the mismatch in one line
    return found is None or isinstance(found, type)  # absent: build names it too


def _check_targets(node: Any) -> None:
    if isinstance(node, list):  # hydra instantiates list items too (process.prediction)
        for v in node:
            _check_targets(v)
    elif isinstance(node, dict):
        target = node.get("_target_")
        if target is not None and not _allowed(str(target)):
            raise ModelFileError(
                f"checkpoint names a disallowed class {target!r} (a model file builds only "
                "cdlm's own classes)"
            )
        for v in node.values():
            _check_targets(v)


def current_names(node: Any) -> Any:
    """A stored config with each moved class's old ``_target_`` replaced by its new one, so
    that an older file still builds and the model it gives (a teacher, say) records today's."""
    if isinstance(node, dict):
        return {
            k: MOVED.get(v, v) if k == "_target_" and isinstance(v, str) else current_names(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [current_names(v) for v in node]
    return node


def stored_layout(config: dict) -> dict:
    """A stored config whose block process predates the block tail (issue 51: no
    ``sees_last``) keeps the layout it was trained in, blind to each block's last token."""
    process = config.get("process") or {}
    if process.get("_target_") == "cdlm.processes.block.BlockProcess":
        return config | {"process": {"sees_last": False} | process}
    return config


# A torch.save file (a Lightning .ckpt among them) is a zip archive, or in the legacy format a
# pickle opening with its protocol (2 to 5); the first bytes say so without unpickling anything.
_TORCH_SAVE_MAGIC = (b"PK\x03\x04", b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")
_MAX_HEADER = 100_000_000  # the safetensors format's own limit on the JSON header


def _lightning_message(path: Path) -> str:
    """Names the run's model file when it sits near the .ckpt (run/checkpoints/last.ckpt)."""
    near = [p / "model.safetensors" for p in (path.parent, path.parent.parent)]
    model = next(
        (str(p) for p in near if p.is_file()), "the model.safetensors in the same run folder"
    )
    if path.suffix != ".ckpt":
        return (
            f"{path} is a torch.save (pickle) file, not a cdlm model; a Lightning training "
            f"checkpoint resumes training (cdlm-train resume={path}); sample from {model}"
        )
    return (
        f"{path} is a Lightning training checkpoint (for resuming: cdlm-train resume={path}); "
        f"sample from {model}"
    )


def _expected_size(n: int, header: bytes) -> int:
    """The file size a safetensors header of ``n`` bytes describes (header + tensor data)."""
    if len(header) < n:
        return 8 + n
    try:
        entries = json.loads(header)
        ends = [v["data_offsets"][1] for k, v in entries.items() if k != "__metadata__"]
        return 8 + n + int(max(ends, default=0))
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return 0  # a malformed header: the safetensors reader names the problem


def check_model_file(path: str | Path) -> None:
    """Raises a ``ModelFileError`` saying what ``path`` is when it cannot be a cdlm model file:
    missing, empty, a Lightning (torch.save) checkpoint, or a truncated safetensors file.

    Reads the safetensors layout (an 8-byte little-endian header length, then a JSON header)
    and nothing else; a file it does not recognise is left to the safetensors reader's message.
    """
    if hub.is_hub_id(str(path)):
        return  # a Hub repository: checked when it is downloaded
    path = Path(str(path))
    if path.is_dir():
        if not (path / hub.WEIGHTS).is_file():
            raise ModelFileError(
                f"{path} is a folder without {hub.WEIGHTS} (give a cdlm-train run folder, a "
                "save_pretrained folder or a model file)"
            )
        path = path / hub.WEIGHTS
    if not path.is_file():
        raise ModelFileError(f"checkpoint not found: {path}")
    size = path.stat().st_size
    if size == 0:
        raise ModelFileError(f"cannot read checkpoint {path}: the file is empty (0 bytes)")
    with path.open("rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little")
        header = f.read(n) if len(head) == 8 and n <= _MAX_HEADER else b""
    if not header.startswith(b"{"):
        if head.startswith(_TORCH_SAVE_MAGIC):
            raise ModelFileError(_lightning_message(path))
        return
    expected = _expected_size(n, header)
    if size < expected:
        raise ModelFileError(
            f"cannot read checkpoint {path}: the file is truncated ({size} bytes, its header "
            f"describes {expected}); an interrupted copy or download? copy it again"
        )


def _local(ref: str | Path, revision: str | None = None) -> tuple[Path, dict]:
    """(model file, card facts) of a file, a model folder or a Hub id."""
    try:
        folder = hub.resolve(ref, revision)
    except hub.HubError as e:
        raise ModelFileError(str(e)) from None
    check_model_file(folder)
    facts = hub.read_config(folder).get("card", {}) if folder.is_dir() else {}
    return hub.weights_path(folder), facts


def load_model(
    path: str | Path,
    device: str | torch.device = "cpu",
    revision: str | None = None,
    *,
    process: Any = None,
    embedding: str | None = None,
    world_options: Any = None,
) -> Model:
    """A model from a ``.safetensors`` file, a model folder (``save_pretrained``, a cdlm-train
    run folder) or a Hugging Face Hub id (``revision``: a branch, tag or commit); a pretrained
    causal LM (``hf:...``, ``smollm2``: ``base_model``); or a world's exact posterior under
    ``process`` (``world:<name>``: ``world_model``, with ``embedding`` and the world's
    ``world_options``). ``process`` belongs to worlds alone: a file carries its own."""
    if worlds.is_world(str(path)):
        table = None if embedding is None else load_model(embedding)
        return world_model(str(path), process, device, table, world_options)
    if process is not None or embedding is not None or worlds.options_set(world_options):
        raise ModelFileError(
            f"process=, embedding= and world_options apply to world:<name> models; {path} "
            "carries its own"
        )
    if pretrained.is_base(str(path)):
        return pretrained.base_model(str(path), device)
    path, facts = _local(path, revision)
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        state = load_file(str(path), device=str(device))
    except (SafetensorError, OSError, ValueError) as e:
        raise ModelFileError(f"cannot read checkpoint {path}: {e}") from None
    if meta.get("format") != FORMAT:
        raise ModelFileError(f"{path} is not a cdlm checkpoint (no '{FORMAT}' metadata)")
    try:  # a header damaged in place still parses as safetensors; its cdlm part may not
        config = json.loads(meta["config"])
        tokenizer_json, special_tokens = meta["tokenizer"], json.loads(meta["special_tokens"])
        if not isinstance(config, dict) or not isinstance(special_tokens, dict):
            raise ValueError("config and special_tokens are not JSON objects")
    except (KeyError, ValueError) as e:
        raise ModelFileError(f"{path}: its cdlm metadata is damaged ({e})") from None
    config = stored_layout(current_names(config))
    _check_targets(config)  # by today's names: a class that moved is checked where it is now
    process, network = (build(path, config, part) for part in ("process", "network"))
    for prefix, module in (("process.", process), ("network.", network)):
        part = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
        try:
            module.load_state_dict(part)
        except RuntimeError as e:
            cause = " ".join(str(e).split())  # torch's message spans lines
            raise ModelFileError(
                f"{path}: weights do not match the stored config: {cause}"
            ) from None
    try:
        tokenizer = wrap(tokenizer_json, special_tokens)
    except Exception as e:  # noqa: BLE001 (the tokenizers library raises bare Exceptions)
        raise ModelFileError(f"{path}: its stored tokenizer is damaged ({e})") from None
    return Model(process.to(device).eval(), network.to(device).eval(), tokenizer, config, facts)


def from_pretrained(
    ref: str | Path, device: str | torch.device = "cpu", revision: str | None = None
) -> Model:
    """``cdlm.from_pretrained``: a model folder, a model file or a Hub id (``owner/name``)."""
    return load_model(ref, device, revision)


def load_network_weights(network: nn.Module, source: Model, path: str | Path) -> None:
    """Initialises ``network`` from the network of the cdlm model ``source`` (loaded from
    ``path``): e.g. masked or uniform from an AR model (DiffuLLaMA / Dream adaptation), uniform
    from a masked one. The parameter names and shapes must match; a network that does not fit
    is refused in one line that names the first differences."""
    own, theirs = network.state_dict(), source.network.state_dict()
    differences = [f"missing {k}" for k in own if k not in theirs]
    differences += [f"unexpected {k}" for k in theirs if k not in own]
    differences += [
        f"{k} is {tuple(theirs[k].shape)} there, {tuple(own[k].shape)} here"
        for k in own
        if k in theirs and theirs[k].shape != own[k].shape
    ]
    if differences:
        kind = source.config.get("process", {}).get("_target_", "?").rsplit(".", 1)[-1]
        more = f" (+{len(differences) - 3} more)" if len(differences) > 3 else ""
        raise ModelFileError(
            f"init_from {path} ({kind}): its network does not fit this run's: "
            + "; ".join(differences[:3])
            + more
        )
    network.load_state_dict(theirs)
