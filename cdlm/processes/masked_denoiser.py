"""The masked process's denoiser: SUBS log-probabilities (MDLM Sec. 3.2), optionally in the
shifted next-token layout (Dream). It feeds the network no time: the count of masks tells it
the level (MDLM Sec. 3.4), and the cached samplers rely on a time-free denoiser."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from cdlm.denoiser import NetworkDenoiser, Prediction, full_precision
from cdlm.processes.support import TokenSupport


class MaskedDenoiser(NetworkDenoiser):
    """SUBS: log-probabilities with -inf on [MASK] (and on every id outside ``support``, the
    process's ``cdlm.processes.support``, which holds [MASK] among its excluded ids), and
    unmasked inputs copied through.

    With ``shift_from`` (a BOS id) the prediction for position i is read from the network's
    output at position i - 1 of the input [BOS, z_0, ..., z_{L-1}] (Dream, Ye et al. 2025): the
    layout of a next-token predictor, so an AR checkpoint drops in unchanged, and a masked
    position's left neighbour reaches its prediction through the residual stream rather than
    only through attention (which is what keeps a masked model from scratch on the unigram
    plateau for hundreds of steps).
    """

    def __init__(
        self,
        network: nn.Module,
        mask_id: int,
        shift_from: int | None = None,
        support: TokenSupport | None = None,
    ) -> None:
        self.network, self.mask_id, self.shift_from = network, mask_id, shift_from
        self.support = support

    def __call__(
        self,
        z: Tensor,
        t: Tensor,
        self_cond: Tensor | None = None,
        subs: bool = True,
        *,
        positions: Tensor | None = None,
        **kwargs,
    ) -> Prediction:
        """z: the whole canvas (B, L). ``positions`` (W,): predict only those canvas positions
        (a window, e.g. a block attending to a KV cache passed in ``cache``); the network reads
        the inputs that feed them (z there, or z one to the left after the BOS when shifted),
        at those absolute positions. ``subs=False`` skips the carry-over of unmasked inputs.
        Other keywords (label, cache) reach the network. Returns (B, L or W, V)."""
        zeros = torch.zeros(z.shape[0], device=z.device)
        if positions is None:
            if self.shift_from is None:
                out = self.network(z, zeros, **kwargs)
            else:
                bos = torch.full_like(z[:, :1], self.shift_from)
                out = self.network(torch.cat([bos, z], dim=1), zeros, **kwargs)[:, :-1]
            seen = z
        else:
            inputs = self.window_inputs(z, positions)
            out = self.network(inputs, zeros, positions=positions, **kwargs)
            seen = z[:, positions.clamp(max=z.shape[1] - 1)]
        return self.parameterize(out, seen, subs)

    def parameterize(self, out: Tensor, seen: Tensor, subs: bool = True) -> Prediction:
        """SUBS (MDLM Sec. 3.2): log-probabilities of the network's ``out`` (B, W, V) with none
        on [MASK] or outside the support, and each unmasked input of ``seen`` (B, W) carried
        over (unless not ``subs``)."""
        logits = full_precision(out)
        if self.support is not None:
            logits = self.support.restrict(logits)  # our copy, changed in place below
        else:
            mask_column = torch.tensor([self.mask_id], device=logits.device)
            logits = logits.index_fill(-1, mask_column, -math.inf)
        if subs:
            # a decided position's row becomes 0 at its token and -inf elsewhere before the
            # softmax, which leaves it exactly so (and passes no gradient, as a constant): one
            # pass less than carrying it over after. A masked position's scatter rewrites its
            # [MASK] entry, already -inf.
            known = (seen != self.mask_id)[..., None]
            value = torch.zeros_like(known, dtype=logits.dtype).masked_fill_(~known, -math.inf)
            logits.masked_fill_(known, -math.inf).scatter_(-1, seen[..., None], value)
        return Prediction(logits=logits.log_softmax(-1))

    def window_inputs(self, z: Tensor, positions: Tensor) -> Tensor:
        """The network inputs at ``positions`` of its own sequence: z[positions], or, shifted,
        z[positions - 1] with the BOS at 0 (network position L then holds z's last token)."""
        if self.shift_from is None:
            return z[:, positions]
        left = z[:, (positions - 1).clamp(min=0)]
        return torch.where(positions[None] == 0, self.shift_from, left)

    def network_length(self, length: int) -> int:
        """Positions of the network's sequence for a canvas of ``length`` (+1 for the BOS)."""
        return length + (self.shift_from is not None)
