"""What a sampling run draws (``Plan``) and what it returns (``Generation``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cdlm.guidance import Guidance
from cdlm.regions import Layout

DEFAULT_STEPS = 64
ROUNDINGS = ("argmax", "nearest")


@dataclass(frozen=True)
class Plan:
    """The settings of one sampling run, checked when made.

    ``seq_len`` positions per sample (a ``layout``'s length when one is given), drawn in batches
    of ``batch_size`` (None: one batch) on a ``grid`` of ``steps`` intervals
    (``cdlm.samplers.grids``) from one generator seeded by ``seed``. ``rounding``: ``argmax`` of
    the final logits or the ``nearest`` embedding of the final state (gaussian). ``layout``: the
    canvas of fixed and editable regions (``cdlm.regions.build_layout``); ``strength`` < 1
    restarts its editable text spans from their ids noised (or masked) to t = strength
    (editing). ``guidance``: label and/or prompt guidance. ``denoising``: options of the
    process's own sampling denoiser, passed on unread (gaussian: ``temperature``, ``clamp``).
    ``cut_at_eos``: texts end at the first EOS (else the whole canvas, EOS as line breaks).
    """

    num_samples: int
    seq_len: int
    steps: int = DEFAULT_STEPS
    seed: int = 0
    batch_size: int | None = None
    grid: str = "uniform"
    rounding: str = "argmax"
    layout: Layout | None = None
    strength: float = 1.0
    guidance: Guidance = field(default_factory=Guidance)
    denoising: dict[str, Any] = field(default_factory=dict)
    cut_at_eos: bool = True

    def __post_init__(self) -> None:
        for name in ("steps", "num_samples", "seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.rounding not in ROUNDINGS:
            raise ValueError(f"unknown rounding {self.rounding!r}; valid: {', '.join(ROUNDINGS)}")
        if not 0.0 < self.strength <= 1.0:
            raise ValueError(f"edit strength must be in (0, 1], got {self.strength}")
        if self.layout is not None and len(self.layout.ids) != self.seq_len:
            raise ValueError(
                f"the layout has {len(self.layout.ids)} positions, seq_len is {self.seq_len}"
            )

    @property
    def prompted(self) -> bool:
        """Whether the canvas holds fixed text (what prompt guidance guides on)."""
        return self.layout is not None and not all(self.layout.editable)

    def batches(self) -> list[tuple[int, int]]:
        """(first sample, batch size) of each batch."""
        size = self.batch_size or self.num_samples
        return [
            (first, min(size, self.num_samples - first))
            for first in range(0, self.num_samples, size)
        ]


@dataclass
class Sample:
    text: str
    token_ids: list[int]


@dataclass
class Generation:
    """samples; nfe: network evaluations per sequence; positions: sequence positions the network
    processed per sequence; wall_seconds: sampling time, all batches; stats: a sampler's own
    figures (speculative decoding's accepted lengths), averaged over batches."""

    samples: list[Sample]
    nfe: int
    positions: int
    wall_seconds: float
    stats: dict[str, float] = field(default_factory=dict)  # the sampler's own, batch mean


def decode(tokenizer, ids: list[int], cut_at_eos: bool = True) -> Sample:
    """Cuts at the first EOS (variable length), or with ``cut_at_eos=False`` keeps the whole
    canvas with every EOS written as a line break (packed training data puts EOS between
    paragraphs); special tokens are dropped from the text."""
    eos = tokenizer.eos_token_id
    if cut_at_eos:
        if eos in ids:
            ids = ids[: ids.index(eos)]
        return Sample(text=tokenizer.decode(ids, skip_special_tokens=True).strip(), token_ids=ids)
    pieces, start = [], 0
    for i, token in enumerate([*ids, eos]):
        if token == eos:
            pieces.append(tokenizer.decode(ids[start:i], skip_special_tokens=True).strip())
            start = i + 1
    return Sample(text="\n".join(p for p in pieces if p), token_ids=ids)
