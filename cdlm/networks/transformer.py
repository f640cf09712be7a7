"""The denoiser network: a Transformer with adaLN-Zero noise conditioning (DiT, Peebles & Xie
2023), rotary positions (RoFormer, Su et al. 2021) and PyTorch's fused
``scaled_dot_product_attention``.

It takes explicit typed arguments and never reads a global config. It maps continuous inputs
(B, L, in_dim), e.g. noisy token embeddings, plus a noise level per sequence to outputs
(B, L, out_dim), e.g. token logits. The same code runs in fp32, under bf16 autocast, on CPU and on
CUDA. ``forward`` reads and extends a ``KVCache`` (``cdlm.networks.cache``) for cached AR,
block-diffusion and Fast-dLLM decoding, and takes explicit rotary ``positions``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cdlm.networks.cache import AttentionPattern, KVCache, LayerCache, check_positions
from cdlm.networks.embedding import LabelEmbedding, refuse_labels
from cdlm.networks.fixed_cache import FixedKVCache, kept


def timestep_features(t: Tensor, dim: int, max_period: float = 10_000.0) -> Tensor:
    """Sinusoidal features of a scalar per sequence, (B,) -> (B, dim). ``t`` in [0, 1] is scaled
    by 1000 so that the lowest frequencies still resolve small noise-level differences."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, device=t.device) / half)
    args = 1000.0 * t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class Rotary(nn.Module):
    """Rotary position embedding applied to queries and keys, (B, H, L, Dh). The tables are
    built in fp32 whatever the model's dtype, so a float64 network's angles carry fp32 rounding
    (about 1e-7): kept so that outputs stay bit-identical to earlier versions."""

    def __init__(self, head_dim: int, max_seq_len: int, base: float = 10_000.0) -> None:
        super().__init__()
        inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2).float() / head_dim)
        angles = torch.outer(torch.arange(max_seq_len).float(), inv_freq)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: Tensor, positions: Tensor | int = 0) -> Tensor:
        """x: (B, H, L, Dh); positions: (L,) or (B, L) absolute positions, or an int, the first
        of L consecutive ones (a slice of the tables, the fast path)."""
        if isinstance(positions, int):
            cos = self.cos[positions : positions + x.shape[-2]]
            sin = self.sin[positions : positions + x.shape[-2]]
        else:  # (L, Dh/2), or (B, 1, L, Dh/2) to broadcast over heads
            cos, sin = self.cos[positions], self.sin[positions]
            if positions.dim() == 2:
                cos, sin = cos[:, None], sin[:, None]
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


def modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    return x * (1 + scale[:, None]) + shift[:, None]


class Block(nn.Module):
    """Pre-norm attention + MLP block whose norms are shifted, scaled and gated by the noise
    conditioning (adaLN-Zero: gates start at zero, so each block starts as the identity)."""

    def __init__(self, d_model: int, n_heads: int, mlp_ratio: float, dropout: float) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.norm1 = nn.LayerNorm(d_model, elementwise_affine=False)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)
        self.norm2 = nn.LayerNorm(d_model, elementwise_affine=False)
        hidden = int(mlp_ratio * d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, d_model)
        )
        self.dropout = nn.Dropout(dropout)
        self.ada = nn.Linear(d_model, 6 * d_model)
        nn.init.zeros_(self.ada.weight)
        nn.init.zeros_(self.ada.bias)

    def forward(
        self,
        h: Tensor,
        c: Tensor,
        rotary: Rotary,
        positions: Tensor | int,
        cache: LayerCache | None = None,
        write: bool = True,
        mask: Tensor | None = None,
        is_causal: bool = False,
    ) -> Tensor:
        """h: (B, L, d_model); c: (B, d_model) conditioning; positions: see ``Rotary``; the
        chunk attends to ``cache``'s keys then its own, kept in ``cache`` if ``write``; mask:
        (L, T + L) bool, True = visible."""
        shift1, scale1, gate1, shift2, scale2, gate2 = self.ada(c).chunk(6, dim=-1)
        b, length, d = h.shape
        q, k, v = (
            self.qkv(modulate(self.norm1(h), shift1, scale1))
            .view(b, length, 3, self.n_heads, d // self.n_heads)
            .permute(2, 0, 3, 1, 4)
        )
        q, k = rotary(q, positions), rotary(k, positions)
        if cache is not None:
            k, v = cache.extend(k, v, write)
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal)
        attn = attn.transpose(1, 2).reshape(b, length, d)
        h = h + gate1[:, None] * self.dropout(self.proj(attn))
        return h + gate2[:, None] * self.dropout(self.mlp(modulate(self.norm2(h), shift2, scale2)))


class Transformer(AttentionPattern, nn.Module):
    """Noise-conditioned Transformer, (B, L, in_dim) or (B, L) ids, x (B,) -> (B, L, out_dim).

    Args:
        in_dim: width of each input vector (e.g. the diffusion embedding dimension); or
        in_vocab: number of input token ids (e.g. the vocabulary with its [MASK] token), for
            token input: (B, L) ids, or (B, L, in_vocab) distributions over ids ("soft tokens",
            embedded as their expected embedding). Exactly one of the two is given.
        out_dim: width of each output vector (e.g. the vocabulary size, for logits).
        d_model, n_layers, n_heads, mlp_ratio, dropout: the usual Transformer sizes.
        max_seq_len: longest sequence the rotary tables cover.
        self_condition: accept a second input (the previous estimate of the clean data, Chen et
            al. 2022 "Analog Bits"); zeros stand in when it is absent. Vector input: of width
            ``in_dim``, concatenated to the input; token input: of width ``self_cond_dim``,
            projected and added to the token embedding.
        self_cond_dim: width of the self-conditioning input of a token-input network.
        causal: causal instead of bidirectional attention.
        num_classes: > 0 makes the network class-conditional: a label embedding (plus one for
            "no label", label -1) joins the noise conditioning of every adaLN block.
    """

    def __init__(
        self,
        out_dim: int,
        in_dim: int | None = None,
        in_vocab: int | None = None,
        d_model: int = 256,
        n_layers: int = 4,
        n_heads: int = 4,
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
        max_seq_len: int = 1024,
        self_condition: bool = True,
        causal: bool = False,
        num_classes: int = 0,
        self_cond_dim: int | None = None,
    ) -> None:
        super().__init__()
        if d_model % n_heads or (d_model // n_heads) % 2:
            raise ValueError(f"d_model={d_model} must split into n_heads={n_heads} even heads")
        if (in_dim is None) == (in_vocab is None):
            raise ValueError("give exactly one of in_dim (vector input) or in_vocab (token input)")
        if in_vocab is not None and self_condition and self_cond_dim is None:
            raise ValueError("self_condition with token input (in_vocab) needs self_cond_dim")
        self.in_dim, self.out_dim, self.d_model = in_dim, out_dim, d_model
        self.self_condition, self.causal = self_condition, causal
        # Share of future keys a bidirectional network may attend to in training: below 1 while
        # an AR initialisation is annealed from causal to full attention (MaskedProcess).
        self.future_visibility = 1.0
        self.in_proj = (
            nn.Embedding(in_vocab, d_model)
            if in_vocab is not None
            else nn.Linear(in_dim * (2 if self_condition else 1), d_model)
        )
        if in_vocab is not None and self_condition:
            self.self_cond_proj = nn.Linear(self_cond_dim, d_model)
        self.time_mlp = nn.Sequential(
            nn.Linear(d_model, d_model), nn.SiLU(), nn.Linear(d_model, d_model)
        )
        self.num_classes = num_classes
        if num_classes > 0:
            self.label_embed = LabelEmbedding(num_classes, d_model)
        self.rotary = Rotary(d_model // n_heads, max_seq_len)
        self.blocks = nn.ModuleList(
            Block(d_model, n_heads, mlp_ratio, dropout) for _ in range(n_layers)
        )
        self.norm_out = nn.LayerNorm(d_model, elementwise_affine=False)
        self.ada_out = nn.Linear(d_model, 2 * d_model)
        nn.init.zeros_(self.ada_out.weight)
        nn.init.zeros_(self.ada_out.bias)
        self.out_proj = nn.Linear(d_model, out_dim)

    def new_cache(self) -> KVCache:
        """An empty KV cache, for causal and bidirectional networks alike, preallocated for
        the rotary table's ``max_seq_len`` positions (no concatenation per decoding step)."""
        return KVCache(len(self.blocks), capacity=self.rotary.cos.shape[0])

    def new_fixed_cache(self, batch: int, length: int, graph: bool = False) -> FixedKVCache:
        """An empty fixed-shape cache for a causal network's decoding of ``batch`` rows of
        ``length`` positions (``cdlm.networks.fixed_cache``; every call attends over all
        ``length`` slots; ``graph``: replay the one-token step from a CUDA graph)."""
        if not self.causal:
            raise ValueError("a fixed-shape decode step is for causal (AR) networks")
        check_positions(batch, length, 0, None, self.rotary.cos.shape[0])
        n, device = len(self.blocks), self.rotary.cos.device
        make = lambda: FixedKVCache(n, batch, length, device, graph)  # noqa: E731
        return kept(self, (batch, length, graph, device), make)

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
        lengths: Tensor | None = None,
    ) -> Tensor:
        """x: (B, L, in_dim) vectors, or (B, L) ids or (B, L, in_vocab) soft tokens; t: (B,)
        noise level in [0, 1]; self_cond: (B, L, in_dim) or None; cache: from ``new_cache``,
        attended to and, unless ``cache.frozen``, extended in place by this chunk of any length;
        label: (B,) class ids, -1 (or None) for none; positions: (L,) or (B, L) absolute
        positions for the rotary angles, default ``cache.length`` onward (0 without a cache);
        attn_mask: (L, T + L) bool, True = visible (T cached positions, 0 without a cache),
        e.g. block diffusion's vectorised training mask, or a chunk that writes clean positions
        and denoises a block in one call; it replaces the causal/annealed/cache mask; lengths:
        (B,) each row's real length, the keys at later positions (right padding) hidden from
        every query (``AttentionPattern._unpadded``). A ``FixedKVCache`` runs ``_fixed_step``.
        Returns (B, L, out_dim)."""
        if isinstance(cache, FixedKVCache):
            if any(a is not None for a in (self_cond, positions, attn_mask, lengths)):
                raise ValueError("a fixed-shape step takes tokens, t and a label only")
            return cache.run(lambda *a: self._fixed_step(*a, cache), x, t, label)
        length, past = x.shape[1], 0 if cache is None else cache.length
        rope = check_positions(x.shape[0], length, past, positions, self.rotary.cos.shape[0])
        h = self._embed(x, self_cond)
        c = self._condition(t, label, h)
        mask, is_causal = self._attention(length, cache, x.device, attn_mask)
        shape = (x.shape[0], length)
        mask, is_causal = self._unpadded((mask, is_causal), rope, lengths, cache, shape, x.device)
        write = cache is not None and not cache.frozen
        for i, block in enumerate(self.blocks):
            layer = None if cache is None else cache[i]
            h = block(h, c, self.rotary, rope, layer, write, mask, is_causal)
        return self._readout(h, c)

    def _fixed_step(self, x: Tensor, t: Tensor, label: Tensor | None, cache: FixedKVCache):
        """The forward pass over a fixed cache: no host sync and no Python branch on a value
        that changes between calls, so a one-token call can be captured in a CUDA graph."""
        h = self._embed(x, None)
        c = self._condition(t, label, h)
        rope, mask = cache.slots(x.shape[1]), cache.mask(x.shape[1])
        for block, layer in zip(self.blocks, cache, strict=True):
            h = block(h, c, self.rotary, rope, layer, True, mask, False)
        cache.advance(x.shape[1])
        return self._readout(h, c)

    def _embed(self, x: Tensor, self_cond: Tensor | None) -> Tensor:
        """(B, L, d_model): the input, with its self-conditioning estimate (zeros if none)."""
        tokens_in = isinstance(self.in_proj, nn.Embedding)
        if self.self_condition and not tokens_in:
            x = torch.cat([x, torch.zeros_like(x) if self_cond is None else self_cond], dim=-1)
        if tokens_in and x.is_floating_point():
            h = x.to(self.in_proj.weight.dtype) @ self.in_proj.weight  # soft tokens
        else:
            h = self.in_proj(x)
        if self.self_condition and tokens_in:
            width = self.self_cond_proj.in_features
            estimate = h.new_zeros(*h.shape[:2], width) if self_cond is None else self_cond
            h = h + self.self_cond_proj(estimate.to(h.dtype))
        return h

    def _condition(self, t: Tensor, label: Tensor | None, h: Tensor) -> Tensor:
        """(B, d_model): the adaLN conditioning of noise level ``t`` and ``label``, in the
        dtype of the embedded input ``h``."""
        c = self.time_mlp(timestep_features(t, self.d_model).to(h.dtype))
        if self.num_classes > 0:
            c = c + self.label_embed.of(label, h.shape[0], h.device).to(c.dtype)
        else:
            refuse_labels(label)
        return c

    def _readout(self, h: Tensor, c: Tensor) -> Tensor:
        shift, scale = self.ada_out(c).chunk(2, dim=-1)
        return self.out_proj(modulate(self.norm_out(h), shift, scale))
