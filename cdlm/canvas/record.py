"""Recording a denoising trajectory through the sampler callback.

Every sampler reports each step as a ``StepInfo`` (``cdlm.samplers.base``), so one recorder
serves every sampler and process: it reads the state the way the state is written, not by the
process's name. A token state ((B, L) ids: masked, autoregressive) shows its committed tokens,
with [MASK] (``process.mask_id``) or, for a process that decodes in order (``sequential``), the
positions after the current one undecided; an embedding state ((B, L, D): gaussian) shows each
position's argmax token under the step's prediction, with its probability as the confidence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from cdlm.samplers.base import StepInfo


@dataclass
class Frame:
    """One step of one batch. step: the sampler's step index; t -> s: the interval; nfe: network
    evaluations so far per sequence (guidance passes counted); tokens (B, L): what each position
    shows; decided (B, L): holds a token (not [MASK], not a position still to come);
    confidence (B, L): the shown token's probability (at its commit, for a committed token);
    changed (B, L): decided or revised at this step."""

    step: int
    t: float
    s: float
    nfe: int
    tokens: Tensor
    decided: Tensor
    confidence: Tensor
    changed: Tensor


@dataclass
class Trajectory:
    """The frames of one batch; ``first``: the index of its first sample; ``order`` (B, L): the
    step at which each position was first decided (-1: never, or held fixed)."""

    first: int
    frames: list[Frame] = field(default_factory=list)
    order: Tensor | None = None


def _probabilities(logits: Tensor) -> Tensor:
    """Probabilities from logits or log-probabilities (-inf entries stay 0), in float32."""
    return torch.softmax(logits.float(), -1)


class Recorder:
    """A sampler callback that keeps every step of every batch (on the CPU, compact).

    Args:
        process: the model's process (read for ``mask_id`` and ``sequential``).
        fixed: (L,) bool, positions held fixed (a prompt, infill context): shown apart.
        passes: network passes per call (2 under classifier-free guidance), for the NFE.
        on_frame: called with each new frame and its trajectory (a live view).
    """

    def __init__(
        self,
        process,
        fixed: Tensor | None = None,
        passes: int = 1,
        on_frame: Callable[[Frame, Trajectory], None] | None = None,
    ) -> None:
        self.mask_id, self.sequential = process.mask_id, process.sequential
        self.fixed = None if fixed is None else fixed.detach().bool().cpu()
        self.passes, self.on_frame = passes, on_frame
        self.trajectories: list[Trajectory] = []
        self._calls, self._last_prediction, self._seen = 0, None, 0

    def __call__(self, info: StepInfo) -> None:
        if info.i == 0 or not self.trajectories:  # every sampler starts a batch at step 0
            first = self._seen
            self._seen += info.x.shape[0]
            self.trajectories.append(Trajectory(first=first))
            self._calls, self._last_prediction = 0, None
        if info.prediction is not None and info.prediction is not self._last_prediction:
            self._calls += 1  # a cached sampler reuses its last prediction: no new call
            self._last_prediction = info.prediction
        trajectory = self.trajectories[-1]
        previous = trajectory.frames[-1] if trajectory.frames else None
        frame = self._frame(info, previous)
        trajectory.frames.append(frame)
        if trajectory.order is None:
            trajectory.order = torch.full(frame.tokens.shape, -1, dtype=torch.long)
        fresh = frame.decided & (trajectory.order < 0)
        if self.fixed is not None:
            fresh &= ~self.fixed  # a fixed region is there from the start, never committed
        trajectory.order[fresh] = info.i
        if self.on_frame is not None:
            self.on_frame(frame, trajectory)

    def _frame(self, info: StepInfo, previous: Frame | None) -> Frame:
        x = info.x.detach()
        logits = info.prediction.logits.detach() if info.prediction is not None else None
        batch, length = x.shape[:2]
        if x.is_floating_point():  # an embedding state: show the prediction's argmax
            probs = _probabilities(logits)
            confidence, tokens = probs.max(-1)
            decided = torch.ones(batch, length, dtype=torch.bool, device=x.device)
        else:
            tokens = x.long()
            if self.sequential:
                decided = (torch.arange(length, device=x.device) <= info.i).expand(batch, -1)
            elif self.mask_id is not None:
                decided = tokens != self.mask_id
            else:
                decided = torch.ones_like(tokens, dtype=torch.bool)
            confidence = self._token_confidence(tokens, logits, info.i)
        tokens, decided = tokens.cpu(), decided.cpu()
        confidence = confidence.float().cpu()
        if previous is None:
            changed = decided.clone()
        else:
            changed = (tokens != previous.tokens) | (decided & ~previous.decided)
            if not x.is_floating_point():  # a committed token keeps its commit confidence
                keep = previous.decided & decided & (tokens == previous.tokens)
                confidence = torch.where(keep, previous.confidence, confidence)
        return Frame(
            step=info.i,
            t=float(info.t),
            s=float(info.s),
            nfe=self._calls * self.passes,
            tokens=tokens,
            decided=decided,
            confidence=confidence,
            changed=changed & decided,
        )

    def _token_confidence(self, tokens: Tensor, logits: Tensor | None, i: int) -> Tensor:
        """Probability of each position's token under this step's prediction; an AR step with a
        KV cache predicts only position i (its last output row)."""
        out = torch.zeros(tokens.shape, device=tokens.device)
        if logits is None:
            return out
        if logits.shape[1] == tokens.shape[1]:
            probs = _probabilities(logits)
            return probs.gather(-1, tokens.clamp(0, probs.shape[-1] - 1)[..., None]).squeeze(-1)
        if self.sequential and i < tokens.shape[1]:
            probs = _probabilities(logits[:, -1])
            out[:, i] = probs.gather(-1, tokens[:, i, None]).squeeze(-1)
        return out

    def rows(self) -> list[tuple[Trajectory, int]]:
        """(trajectory, row in it) for every sample, in sample order."""
        return [(tr, r) for tr in self.trajectories for r in range(tr.frames[0].tokens.shape[0])]
