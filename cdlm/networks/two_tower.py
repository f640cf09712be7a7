"""Two towers for block diffusion (Nemotron-Labs-TwoTower, NVIDIA 2026): a frozen causal context
tower, the pretrained base itself, and a trainable denoiser tower initialised from the same
base that decodes a block with bidirectional in-block attention and attends, layer by layer, to
the context tower's keys and values of the clean past.

Both towers are ``CausalLM``s. The context tower's keys and values are what it writes into
cdlm's ``KVCache``, so the cache of a two-tower model is exactly the base's AR cache, and the
clean stream (next-token logits, the verifier of ``sampler=speculative``) is exactly the base:
adaptation cannot hurt it. The denoiser tower reads that cache read-only, through the same
``LayerCaches`` seam, and never writes.

The block process tells the network which of a call's inputs are clean (``clean``: (N,) bool,
``BlockDenoiser`` passes it to networks with ``reads_streams``); the call's attention mask
(``attn_mask``, (N, T + N)) is split accordingly: clean rows run in the context tower over the
cached and clean columns, the other rows in the denoiser tower over cached, clean and their own.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from cdlm.networks.cache import KVCache
from cdlm.networks.causal_lm import CausalLM


def _scratch(cache: KVCache | None, n_layers: int) -> KVCache:
    """A cache the context tower may write into: the given one when it is writable, else a
    shallow copy (writing extends by concatenation, so the original stays as it was)."""
    if cache is not None and not cache.frozen:
        return cache
    work = KVCache(n_layers)
    if cache is not None:
        for mine, theirs in zip(work, cache, strict=True):
            mine.k, mine.v = theirs.k, theirs.v
    return work


def stream_flags(network: nn.Module, clean: int, noisy: int, clean_first: bool, device) -> dict:
    """``clean=`` (which of a call's inputs are the clean stream: ``clean`` of them, then or
    after ``noisy`` others) for a network that runs the streams apart (``reads_streams``);
    nothing for one that reads the attention mask alone."""
    if not getattr(network, "reads_streams", False):
        return {}
    flags = [torch.ones(clean, dtype=torch.bool), torch.zeros(noisy, dtype=torch.bool)]
    return {"clean": torch.cat(flags if clean_first else flags[::-1]).to(device)}


class TwoTower(nn.Module):
    """The ``CausalLM`` arguments; ``lora_rank`` and ``gradient_checkpointing`` apply to the
    denoiser tower (the context tower is frozen and runs without gradients)."""

    reads_streams = True  # BlockDenoiser passes ``clean``

    def __init__(self, base: dict, out_dim: int, in_vocab: int | None = None, **kwargs) -> None:
        super().__init__()
        kwargs.pop("causal", None)  # fixed: the context tower causal, the denoiser not
        context_kwargs = {k: v for k, v in kwargs.items() if k not in ("lora_rank", "lora_alpha")}
        self.context = CausalLM(base, out_dim, in_vocab, causal=True, **context_kwargs)
        self.denoiser = CausalLM(base, out_dim, in_vocab, causal=False, **kwargs)
        self.context.requires_grad_(False)
        self.num_classes = self.denoiser.num_classes  # labels go to the denoiser tower

    def train(self, mode: bool = True) -> TwoTower:
        super().train(mode)
        self.context.eval()  # frozen: no dropout, whatever the module's mode
        return self

    def load_base(self, model: nn.Module) -> None:
        """Both towers start as the base."""
        self.context.load_base(model)
        self.denoiser.load_base(model)

    def new_cache(self) -> KVCache:
        return self.context.new_cache()

    def new_fixed_cache(self, batch: int, length: int, graph: bool = False) -> KVCache:
        raise ValueError("a fixed-shape decode step needs cdlm's own Transformer network")

    def forward(
        self,
        x: Tensor,
        t: Tensor,
        self_cond: Tensor | None = None,
        cache: KVCache | None = None,
        label: Tensor | None = None,
        *,
        positions: Tensor | None = None,
        attn_mask: Tensor | None = None,
        clean: Tensor | None = None,
    ) -> Tensor:
        """``CausalLM.forward``'s arguments plus ``clean`` (None: every input is clean)."""
        n, past = x.shape[1], 0 if cache is None else cache.length
        if clean is None:
            clean = torch.ones(n, dtype=torch.bool, device=x.device)
        if positions is None:
            positions = torch.arange(past, past + n, device=x.device)
        if positions.dim() != 1:
            raise ValueError("two towers take shared positions (L,), not per row")
        if attn_mask is None:  # a plain call: the context tower's own causal attention
            attn_mask = torch.ones(n, past + n, dtype=torch.bool, device=x.device).tril(past)
        ci, ni = clean.nonzero().squeeze(-1), (~clean).nonzero().squeeze(-1)
        cached = torch.arange(past, device=x.device)
        if bool(attn_mask[ci][:, past + ni].any()):
            raise ValueError("a clean input attends to a noisy one: no two-tower form")
        work = _scratch(cache, len(self.context.lm.model.layers))
        parts = []
        if len(ci):
            with torch.no_grad():
                ctx = self.context(
                    x[:, ci],
                    t,
                    cache=work,
                    label=label,
                    positions=positions[ci],
                    attn_mask=attn_mask[ci][:, torch.cat([cached, past + ci])],
                )
            parts.append((ci, ctx))
        if len(ni):
            columns = torch.cat([cached, past + ci, past + ni])
            with work.read_only():
                den = self.denoiser(
                    x[:, ni],
                    t,
                    cache=work,
                    label=label,
                    positions=positions[ni],
                    attn_mask=attn_mask[ni][:, columns],
                )
            parts.append((ni, den))
        out = parts[-1][1].new_empty(x.shape[0], n, parts[-1][1].shape[-1])
        for index, logits in parts:
            out[:, index] = logits.to(out.dtype)
        return out
