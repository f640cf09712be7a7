"""The ``Process`` protocol every noise process implements, and the records it returns.

A process owns its time draw, its corruption, its loss weight, its prior and its loss; training,
distillation, samplers and evaluation only talk to it through the methods below (see
``docs/guide/architecture.md``). Its methods named like queries change no state: the training-time
phase (``ar_phase``, set by ``cdlm.training.phases.Phases``) is read, never advanced, and the
time sampler learns only through an explicit ``observe``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from cdlm.denoiser import Denoiser


@dataclass
class Corrupted:
    """One draw of the forward process, the same record for every process.

    tokens: (B, L) clean ids; x0: the clean state in the process's space ((B, L, D) embeddings
    or (B, L) ids); x_t: the corrupted state the denoiser reads; t: (B,) or per token (B, L)
    levels; noisy: (B, L) bool, the positions whose own observation was corrupted (every
    position for gaussian noise, the masked ones for masking); noise: the Gaussian draw
    (gaussian only), so that a teacher and a student can see the very same x_t.
    """

    tokens: Tensor
    x0: Tensor
    x_t: Tensor
    t: Tensor
    noisy: Tensor
    noise: Tensor | None = None


@dataclass
class LossOutput:
    """loss: scalar to optimise; metrics: extra scalars to log (already detached);
    observation: (levels (n,), per-sequence losses (n,)) for the time sampler's ``observe``,
    or None."""

    loss: Tensor
    metrics: dict[str, Tensor] = field(default_factory=dict)
    observation: tuple[Tensor, Tensor] | None = None


@dataclass
class LevelEval:
    """The raw material of the per-noise-level diagnostics (``cdlm.evaluation.levels``).

    logits: (B, L, V) the model's token logits; tokens: (B, L) the truth; scored: (B, L) bool,
    the corrupted positions (the ones worth scoring); evidence: (B, L, V) log-likelihood of each
    token given only the position's own observation (0 everywhere for a masked position, the
    noisy-embedding readout for gaussian noise): the no-context readout and the emissions of the
    exact bigram denoiser.
    """

    logits: Tensor
    tokens: Tensor
    scored: Tensor
    evidence: Tensor


@runtime_checkable
class Process(Protocol):
    """What gaussian, masked and autoregressive processes share.

    Attributes say what a process can do, so callers ask instead of testing its kind or
    probing for attributes (``ProcessModule`` gives every one a default):
    ``kind`` (a name for reports and the sampler registry), ``default_sampler`` (a conf/sampler/
    name), ``loss_is_bound`` (its eval-mode loss is a bound on -log p, or exact),
    ``exact_likelihood``, ``noise_levels`` (``evaluate_at`` is defined), ``sequential`` (its
    samplers call back once per token rather than once per step), ``continuous`` (it noises
    embeddings rather than corrupting tokens), ``causal`` (its network reads left to right),
    ``next_token_layout`` (its network can be trained as a next-token predictor),
    ``self_conditions`` (its network reads its own previous estimate), ``mask_id`` (the
    absorbing token of a corruption that masks, else None), ``canvas_id`` (the placeholder of
    an undecided canvas position, else None), ``block_size`` (the training blocks of a block
    layout, else None), ``fim`` (the sentinels of a fill-in-the-middle model, else None),
    ``trains_on_prompts`` (its loss holds the prompt of prompt→response rows and scores the
    response only: ``cdlm.processes.prompts``), ``uniform_noise`` (the alpha(t) schedule of a
    corruption that redraws tokens uniformly, which an exact denoiser reads as evidence; else
    None).
    """

    kind: str
    default_sampler: str
    loss_is_bound: bool
    exact_likelihood: bool
    noise_levels: bool
    sequential: bool
    continuous: bool
    causal: bool
    next_token_layout: bool
    self_conditions: bool
    mask_id: int | None
    canvas_id: int | None
    block_size: int | None
    fim: Any
    trains_on_prompts: bool
    uniform_noise: nn.Module | None
    vocab_size: int
    ar_phase: bool

    def grid_schedule(self) -> nn.Module | None: ...

    def time_warp(self) -> Any: ...

    def set_progress(self, progress: float) -> None: ...

    def check_prompts(self, prompt_dropout: float) -> None: ...

    def score_hidden(self, denoiser: Denoiser, ids: Tensor, hidden: Tensor) -> Tensor: ...

    @property
    def network_kwargs(self) -> dict[str, Any]: ...

    def make_denoiser(self, network: nn.Module) -> Denoiser: ...

    def sampling_denoiser(
        self,
        network: nn.Module,
        clamp: bool = False,
        condition=None,
        temperature: float = 1.0,
        self_cond_scale: float = 1.0,
    ) -> Denoiser: ...

    def conditioned_denoiser(
        self,
        network: nn.Module,
        *,
        guide=None,
        fixed: Fixed | None = None,
        generator=None,
        **options,
    ) -> Denoiser: ...

    def sample_t(
        self,
        n: int,
        generator: torch.Generator | None = None,
        *,
        device: torch.device | None = None,
        length: int | None = None,
    ) -> Tensor: ...

    def corrupt(
        self, tokens: Tensor, t: Tensor, generator: torch.Generator | None = None
    ) -> Corrupted: ...

    def weight(self, t: Tensor) -> Tensor: ...

    def prior(
        self, shape: tuple[int, int], device: torch.device, generator: torch.Generator | None
    ) -> Tensor: ...

    def loss(self, denoiser: Denoiser, batch: dict[str, Tensor], generator=None) -> LossOutput: ...

    def observe(self, out: LossOutput) -> None: ...

    def start(
        self, x: Tensor, ids: Tensor, editable: Tensor, seeded: Tensor, strength: float, generator
    ) -> Tensor: ...

    def hold_fixed(
        self, denoiser: Denoiser, ids: Tensor, editable: Tensor, generator
    ) -> Denoiser: ...

    def evaluate_at(
        self, denoiser: Denoiser, tokens: Tensor, t: float | Tensor, generator=None
    ) -> LevelEval: ...


@dataclass
class Fixed:
    """A canvas's fixed regions for one batch: ``ids`` (B, L) and ``editable`` (B, L) flags
    (False where the sampler must reproduce ``ids``)."""

    ids: Tensor
    editable: Tensor


class ProcessModule(nn.Module):
    """Base of the process modules: the AR-phase flag the ``Phases`` callback sets, the one
    place where a training loss's statistics reach the time sampler, and the one place where a
    sampling denoiser is assembled."""

    ar_phase = False  # True while a Phases callback trains the network as next-token predictor
    continuous = False
    causal = False
    next_token_layout = False
    self_conditions = False
    mask_id: int | None = None
    canvas_id: int | None = None
    block_size: int | None = None
    fim: Any = None
    trains_on_prompts = False
    uniform_noise: nn.Module | None = None

    def grid_schedule(self) -> nn.Module | None:
        """The noise schedule a logSNR-spaced sampling grid reads, or None."""
        return None

    def time_warp(self) -> Any:
        """The learned time warp's quantile function a warped grid reads, or None."""
        return getattr(self._time_sampler(), "quantile", None)

    def _time_sampler(self) -> Any:
        """Where training draws its levels (``cdlm.time_samplers``), or None."""
        return getattr(self, "time_sampler", None)

    def set_progress(self, progress: float) -> None:
        """Tells the time sampler the share of the training budget spent (its curriculum)."""
        sampler = self._time_sampler()
        if sampler is not None:
            sampler.set_progress(progress)

    def check_prompts(self, prompt_dropout: float) -> None:
        """Refuses prompt→response training (``data.format=pairs``) that this process cannot
        do: any, unless it ``trains_on_prompts``; prompt dropout, which trains the unconditional
        branch of prompt guidance, where its samplers take no prompt guidance (``sequential``)."""
        if not self.trains_on_prompts:
            raise ValueError(
                f"rows with prompts (data.format=pairs, data.prompt_rate > 0) are not supported "
                f"by process={self.kind}: it does not hold a prompt in training (masked, block, "
                "gaussian and autoregressive do)"
            )
        if prompt_dropout > 0 and self.sequential:
            raise ValueError(
                f"condition.prompt_dropout > 0 trains for prompt guidance, which the {self.kind} "
                "process does not take; set condition.prompt_dropout=0"
            )

    def score_hidden(self, denoiser: Denoiser, ids: Tensor, hidden: Tensor) -> Tensor:
        """(B,) the mean log-probability of each row's ``hidden`` tokens of ``ids`` (B, L) given
        the rest of the row (task=correct's word scores)."""
        raise ValueError(f"the {self.kind} process cannot score hidden tokens")

    def conditioned_denoiser(
        self,
        network: nn.Module,
        *,
        guide=None,
        fixed: Fixed | None = None,
        generator: torch.Generator | None = None,
        **options: Any,
    ) -> Denoiser:
        """The denoiser a sampler sees: the network's, wrapped by ``guide`` (guidance, a
        denoiser -> denoiser function), then by the hold on the ``fixed`` regions (drawing its
        noise from ``generator``), then by the process's own sampling wrappers, which alone read
        ``options`` (gaussian: ``temperature``, ``clamp``; token processes refuse them)."""

        def condition(denoiser: Denoiser) -> Denoiser:
            if guide is not None:
                denoiser = guide(denoiser)
            if fixed is not None:
                denoiser = self.hold_fixed(denoiser, fixed.ids, fixed.editable, generator)
            return denoiser

        return self.sampling_denoiser(network, condition=condition, **options)

    def observe(self, out: LossOutput) -> None:
        """Hands a training loss's (levels, losses) to the time sampler, if it learns."""
        sampler = self._time_sampler()
        if out.observation is not None and sampler is not None:
            sampler.observe(*out.observation)
