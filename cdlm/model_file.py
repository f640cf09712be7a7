"""Self-contained, pickle-free model files, alone or in a Hugging Face model folder.

A cdlm checkpoint is one ``.safetensors`` file: the weights of the process (embeddings) and the
network, plus metadata holding the JSON configs that rebuild them and the tokenizer JSON. Loading
never unpickles anything, and only ``cdlm.*`` / ``torch.*`` classes may be instantiated from the
stored configs. Files are written to a temporary name and renamed, so a crash never leaves half a
checkpoint behind. ``Model.save_pretrained`` puts that file in a folder with the Hub's companions
(``cdlm.hub``); every loader here takes the file, such a folder or a Hub id.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import OmegaConf
from safetensors import SafetensorError
from safetensors.torch import load_file, safe_open, save_file
from torch import nn

from cdlm import hub, pretrained, worlds
from cdlm.data.tokenizer import for_base, serialise, wrap
from cdlm.io import atomic_path
from cdlm.networks.causal_lm import CausalLM, base_config, grow_vocabulary
from cdlm.processes.autoregressive import AutoregressiveProcess
from cdlm.processes.vocabulary import token_ids
from cdlm.worlds.oracle import OracleNetwork

FORMAT = "cdlm-1"
ALLOWED_TARGETS = ("cdlm.", "torch.")


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


def _check_targets(node: Any) -> None:
    if isinstance(node, dict):
        target = node.get("_target_")
        if target is not None and not str(target).startswith(ALLOWED_TARGETS):
            raise ModelFileError(f"checkpoint names a disallowed class {target!r}")
        for v in node.values():
            _check_targets(v)


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


def _build(path: Path, config: dict[str, Any], part: str) -> nn.Module:
    """The stored ``part`` config instantiated; one this cdlm cannot build (a file written by
    another version, say) is named in one line."""
    try:
        return instantiate(config[part])
    except InstantiationException as e:
        cause = " ".join(str(e.__cause__ or e).split())
        raise ModelFileError(
            f"{path}: its {part} config does not fit this version of cdlm: {cause}"
        ) from None


def load_model(
    path: str | Path,
    device: str | torch.device = "cpu",
    revision: str | None = None,
    *,
    process: Any = None,
    embedding: str | None = None,
) -> Model:
    """A model from a ``.safetensors`` file, a model folder (``save_pretrained``, a cdlm-train
    run folder) or a Hugging Face Hub id (``revision``: a branch, tag or commit); a pretrained
    causal LM (``hf:...``, ``smollm2``: ``base_model``); or a world's exact posterior under
    ``process`` (``world:<name>``: ``world_model``, with ``embedding``). ``process`` belongs to
    worlds alone: a file carries its own."""
    if worlds.is_world(str(path)):
        return world_model(str(path), process, device, embedding)
    if process is not None or embedding is not None:
        raise ModelFileError(
            f"process= and embedding= apply to world:<name> models; {path} carries its own"
        )
    if pretrained.is_base(str(path)):
        return base_model(str(path), device)
    path, facts = _local(path, revision)
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        state = load_file(str(path), device=str(device))
    except (SafetensorError, OSError, ValueError) as e:
        raise ModelFileError(f"cannot read checkpoint {path}: {e}") from None
    if meta.get("format") != FORMAT:
        raise ModelFileError(f"{path} is not a cdlm checkpoint (no '{FORMAT}' metadata)")
    config = json.loads(meta["config"])
    _check_targets(config)
    process, network = (_build(path, config, part) for part in ("process", "network"))
    for prefix, module in (("process.", process), ("network.", network)):
        part = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
        try:
            module.load_state_dict(part)
        except RuntimeError as e:
            raise ModelFileError(f"{path}: weights do not match the stored config: {e}") from None
    tokenizer = wrap(meta["tokenizer"], json.loads(meta["special_tokens"]))
    return Model(process.to(device).eval(), network.to(device).eval(), tokenizer, config, facts)


GAUSSIAN = "cdlm.processes.gaussian.GaussianProcess"


def world_model(
    spec: str, process: Any, device: str | torch.device = "cpu", embedding: str | None = None
) -> Model:
    """The world ``world:<name>`` (conf/world/) as a cdlm model of ``process``: ``oracle_model``."""
    if process is None:
        raise ModelFileError(
            f"{spec} needs a process: process=masked|gaussian|autoregressive|block"
        )
    try:
        world = worlds.load(spec)
    except ValueError as e:
        raise ModelFileError(str(e)) from None
    model = oracle_model(world, process, device, embedding)
    model.config["world"] = model.config["network"]["world"] = spec
    return model


def oracle_model(
    world: worlds.World,
    process: Any,
    device: str | torch.device = "cpu",
    embedding: str | None = None,
) -> Model:
    """``world`` as a cdlm model of ``process`` (a process config, e.g. conf/process/masked.yaml
    composed) whose network is the world's exact posterior (``OracleNetwork``). A gaussian
    oracle reads the posterior input unshifted (each token's own level, exactly) with no readout
    skip or prediction pieces, over a fixed normalised embedding table (seed 0) or, with
    ``embedding`` (a cdlm model), that model's own table."""
    cfg = OmegaConf.to_container(process, resolve=True) if OmegaConf.is_config(process) else process
    if cfg.get("_target_") == GAUSSIAN:
        cfg = _oracle_gaussian(cfg, embedding)
    elif embedding is not None:
        raise ModelFileError("embedding= applies to a gaussian world model (process=gaussian)")
    kwargs = token_ids(cfg, world.tokenizer)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        built = _build(Path(world.name), {"process": cfg | kwargs}, "process")
    if embedding is not None:
        prefix = "process.embedding."
        table = load_file(str(_local(embedding)[0]))
        built.embedding.load_state_dict(
            {k[len(prefix) :]: v for k, v in table.items() if k.startswith(prefix)}
        )
    network = OracleNetwork(
        world, **built.network_kwargs, shift=built.next_token_layout, mask_id=kwargs.get("mask_id")
    )
    config = {
        "process": cfg | kwargs,
        "network": {"_target_": _qualname(network), "world": world.name},
        "seq_len": world.length,
        "labels": [],
        "world": world.name,
    }
    return Model(built.to(device).eval(), network.to(device).eval(), world.tokenizer, config)


def _oracle_gaussian(cfg: dict, embedding: str | None) -> dict:
    """A gaussian process config made exact for an oracle (see ``world_model``)."""
    objective = cfg.get("objective") or {}
    if "X0MSE" in str(objective.get("_target_", "")):
        raise ModelFileError("a gaussian world model predicts logits: objective=ce")
    cfg = cfg | {
        "input": {"_target_": "cdlm.processes.parameterization.PosteriorInput", "shift": False},
        "objective": objective | {"readout_skip": False},
        "prediction": [],
    }
    if embedding is not None:
        cfg["embed_dim"] = load_model(embedding).config["process"]["embed_dim"]
    return cfg


def prepared_base(spec: str, mask: bool, device: str | torch.device = "cpu"):
    """(base, model, tokenizer) of a pretrained causal LM made ready for a process: its
    tokenizer with a [MASK] token when ``mask`` (``for_base``), its embeddings grown to match
    (``grow_vocabulary``)."""
    base = pretrained.resolve(spec)
    lm, tokenizer = pretrained.load(base, device)
    tokenizer = for_base(tokenizer, mask)
    grow_vocabulary(lm, len(tokenizer))
    return base, lm, tokenizer


def base_model(spec: str, device: str | torch.device = "cpu", seq_len: int = 128) -> Model:
    """A pretrained causal LM as cdlm's AR model, untrained: the base itself, KV-cached by the AR
    sampler, so that speed and quality comparisons against it are like for like
    (``cdlm-eval ckpt=smollm2``). ``seq_len``: the canvas length samplers draw by default."""
    base, lm, tokenizer = prepared_base(spec, mask=False, device=device)
    process = AutoregressiveProcess(len(tokenizer), tokenizer.eos_token_id)
    kwargs = process.network_kwargs | {
        "base": base_config(lm),
        "max_seq_len": lm.config.max_position_embeddings,
    }
    network = CausalLM(**kwargs)
    network.load_base(lm)
    config = {
        "process": {
            "_target_": _qualname(process),
            "vocab_size": len(tokenizer),
            "bos_id": tokenizer.eos_token_id,
        },
        "network": {"_target_": _qualname(network)} | kwargs,
        "seq_len": seq_len,
        "labels": [],
        "base": base.record() | {"weights": "base"},
    }
    return Model(process.to(device).eval(), network.to(device).eval(), tokenizer, config)


def _qualname(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def from_pretrained(
    ref: str | Path, device: str | torch.device = "cpu", revision: str | None = None
) -> Model:
    """``cdlm.from_pretrained``: a model folder, a model file or a Hub id (``owner/name``)."""
    return load_model(ref, device, revision)


def load_network_weights(network: nn.Module, path: str | Path) -> None:
    """Initialises ``network`` from the network weights of a cdlm checkpoint (e.g. a masked
    model from an AR one, DiffuLLaMA / Dream adaptation); the shapes must match."""
    if not hub.is_hub_id(str(path)) and not Path(path).exists():
        raise ModelFileError(f"init_from checkpoint not found: {path}")
    path, _ = _local(path)
    try:
        state = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise ModelFileError(f"cannot read checkpoint {path}: {e}") from None
    part = {k[len("network.") :]: v for k, v in state.items() if k.startswith("network.")}
    try:
        network.load_state_dict(part)
    except RuntimeError as e:
        message = " ".join(str(e).split())
        raise ModelFileError(
            f"init_from {path}: its network does not fit this one: {message}"
        ) from None
