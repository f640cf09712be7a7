"""A Hugging Face causal LM (the LLaMA family: SmolLM2, LLaMA, Qwen2/3, Mistral) as a cdlm token
network, for the autoregressive, masked and block processes.

The transformers model is wrapped, not copied: its embedding, rotary tables, decoder layers,
final norm and head run unchanged, and only the attention pattern is cdlm's. Every decoder layer
is called with an explicit mask (or ``is_causal``), so the same weights run causal (AR), fully
bidirectional (masked diffusion), block-causal (block diffusion's vectorised mask) or annealed
from causal to bidirectional (``future_visibility``, DiffuGPT). cdlm's ``KVCache`` reaches the
attention through ``update``, the one method transformers' attention calls on a cache, so the
AR, block and speculative samplers cache exactly as with cdlm's own Transformer.

The architecture is rebuilt from ``base``, the JSON of the transformers config, so a model file
loads offline without the base's files; ``cdlm.run.build`` copies the base's weights in.
"""

from __future__ import annotations

import inspect

import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn

from cdlm.networks.cache import AttentionPattern, KVCache, check_positions
from cdlm.networks.embedding import LabelEmbedding, refuse_labels


class LayerCaches:
    """cdlm's ``KVCache`` as the cache object transformers' attention expects: ``update``
    returns the cached keys and values followed by the chunk's, keeping the chunk if ``write``."""

    def __init__(self, cache: KVCache, write: bool) -> None:
        self.cache, self.write = cache, write

    def update(self, key: Tensor, value: Tensor, layer_idx: int, *args, **kwargs):
        return self.cache[layer_idx].extend(key, value, self.write)


def _cache_keyword(layer: nn.Module) -> str:
    """The decoder layers' name for the cache argument (``cache`` from transformers 5.x,
    ``past_key_values`` before)."""
    names = inspect.signature(layer.forward).parameters
    return "cache" if "cache" in names else "past_key_values"


class CausalLM(AttentionPattern, nn.Module):
    """(B, L) ids or (B, L, V) soft tokens, t (B,) ignored -> (B, L, V) logits.

    Args:
        base: the transformers config as a dict (``model_type`` included), with the vocabulary
            already grown by any tokens cdlm added ([MASK], padding).
        in_vocab, out_dim: the process's vocabulary; both must equal ``base``'s.
        causal: causal attention (AR) instead of bidirectional.
        max_seq_len: longest sequence a call may address (the data's length + 1).
        num_classes: > 0 adds a label embedding (zero at start, so the base is unchanged) to
            every input position: class conditioning and classifier-free guidance.
        lora_rank: > 0 trains LoRA adapters (``peft``) on the attention and MLP projections
            and freezes the rest (the label embedding stays trainable).
        gradient_checkpointing: recompute decoder layers in the backward pass (less memory).
        self_condition, self_cond_dim: refused (taken so that the refusal names the problem).
    """

    def __init__(
        self,
        base: dict,
        out_dim: int,
        in_vocab: int | None = None,
        causal: bool = False,
        max_seq_len: int = 1024,
        num_classes: int = 0,
        self_condition: bool = False,
        self_cond_dim: int | None = None,
        lora_rank: int = 0,
        lora_alpha: float = 16.0,
        gradient_checkpointing: bool = False,
        in_dim: int | None = None,
    ) -> None:
        super().__init__()
        from transformers import AutoConfig, AutoModelForCausalLM

        if in_vocab is None or in_dim is not None or self_condition:
            raise ValueError(
                "a pretrained causal LM reads token ids (or soft tokens): it serves "
                "process=autoregressive, masked or block, not vector input or self-conditioning"
            )
        # Hydra hands dict arguments over as DictConfig; transformers wants plain containers
        settings = OmegaConf.to_container(base) if isinstance(base, DictConfig) else dict(base)
        config = AutoConfig.for_model(settings.pop("model_type"), **settings)
        if not in_vocab == out_dim == config.vocab_size:
            raise ValueError(
                f"the process's vocabulary ({in_vocab} in, {out_dim} out) is not the base's "
                f"({config.vocab_size}); build through init_from=hf:..., which grows it"
            )
        self.lm = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
        table = self.lm.get_input_embeddings()
        if table.padding_idx is not None:
            # cdlm starts and separates sequences with the EOS, often the base's pad token: its
            # row must train, and a zero row (the fresh init's) makes the gradient at that
            # position blow up through every RMSNorm of a deep network (NaN at 30 layers)
            with torch.no_grad():
                table.weight[table.padding_idx].normal_(0.0, config.initializer_range)
            table.padding_idx = None
        self.causal, self.max_seq_len, self.num_classes = causal, max_seq_len, num_classes
        self.future_visibility = 1.0
        self._cache_kw = _cache_keyword(self.lm.model.layers[0])
        if gradient_checkpointing:
            self.lm.gradient_checkpointing_enable()
        if lora_rank > 0:
            self._add_lora(lora_rank, lora_alpha)
        if num_classes > 0:
            self.label_embed = LabelEmbedding(num_classes, config.hidden_size)

    def _add_lora(self, rank: int, alpha: float) -> None:
        """LoRA adapters in place (the module tree keeps its paths); only they train."""
        try:
            from peft import LoraConfig, inject_adapter_in_model
        except ImportError:
            raise ValueError("network.lora_rank > 0 needs peft: pip install peft") from None
        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets)
        inject_adapter_in_model(config, self.lm)
        for name, p in self.lm.named_parameters():
            p.requires_grad_("lora_" in name)

    def load_base(self, model: nn.Module) -> None:
        """Copies a loaded base model's weights in (its vocabulary grown to this one's)."""
        own = set(self.lm.state_dict())

        def name(key: str) -> str:  # LoRA moves a wrapped layer's weights under base_layer
            head, leaf = key.rsplit(".", 1)
            wrapped = f"{head}.base_layer.{leaf}"
            return wrapped if key not in own and wrapped in own else key

        state = {name(k): v for k, v in model.state_dict().items()}
        missing, unexpected = self.lm.load_state_dict(state, strict=False)
        missing = [k for k in missing if "lora_" not in k and k != "lm_head.weight"]
        if missing or unexpected:
            raise ValueError(
                f"the base's weights do not fit: missing {missing[:3]}, unexpected {unexpected[:3]}"
            )
        self.lm.tie_weights()

    def new_cache(self) -> KVCache:
        """An empty KV cache, one layer per decoder layer."""
        return KVCache(len(self.lm.model.layers))

    def new_fixed_cache(self, batch: int, length: int, graph: bool = False) -> KVCache:
        raise ValueError("a fixed-shape decode step needs cdlm's own Transformer network")

    def _embed(self, x: Tensor, label: Tensor | None) -> Tensor:
        table = self.lm.get_input_embeddings()
        if x.is_floating_point():  # soft tokens: their expected embedding
            h = x.to(table.weight.dtype) @ table.weight
        else:
            h = table(x)
        if self.num_classes > 0:
            h = h + self.label_embed.of(label, x.shape[0], x.device)[:, None].to(h.dtype)
        else:
            refuse_labels(label)
        return h

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
        """The arguments of ``cdlm.networks.transformer.Transformer.forward`` (t is unused: the
        token processes pass zeros)."""
        length, past = x.shape[1], 0 if cache is None else cache.length
        start = check_positions(x.shape[0], length, past, positions, self.max_seq_len)
        if isinstance(start, int):
            pos = torch.arange(start, start + length, device=x.device)[None]
        else:
            pos = start if start.dim() == 2 else start[None]
        mask, is_causal = self._attention(length, cache, x.device, attn_mask)
        shape = (x.shape[0], length)
        mask, is_causal = self._unpadded((mask, is_causal), start, lengths, cache, shape, x.device)
        if mask is not None and mask.dim() == 2:
            mask = mask[None, None]
        h = self._embed(x, label)
        body = self.lm.model
        rotary = body.rotary_emb(h, position_ids=pos)
        layers = None if cache is None else LayerCaches(cache, not cache.frozen)
        for layer in body.layers:
            out = layer(
                h,
                attention_mask=mask,
                position_ids=pos,
                position_embeddings=rotary,
                is_causal=is_causal,
                **{self._cache_kw: layers},
            )
            h = out[0] if isinstance(out, tuple) else out
        return self.lm.lm_head(body.norm(h))


# Config entries that describe one file or run, not the architecture.
_NOT_ARCHITECTURE = {
    "quantization_config",
    "_name_or_path",
    "_model_name_or_path",
    "transformers_version",
    "architectures",
    "id2label",
    "label2id",
    "dtype",
    "torch_dtype",
    "_attn_implementation",
}


def base_config(model: nn.Module) -> dict:
    """The JSON that rebuilds a loaded transformers model's architecture (``CausalLM(base=)``)."""
    return {k: v for k, v in model.config.to_dict().items() if k not in _NOT_ARCHITECTURE}


@torch.no_grad()
def grow_vocabulary(model: nn.Module, size: int) -> None:
    """Resizes a transformers model's embeddings (and an untied head) to ``size`` rows; each new
    row is the mean of the old ones, a token the model reads as "some token" ([MASK] must carry
    no identity), and a head row that no token prefers."""
    old = model.get_input_embeddings().weight.shape[0]
    if size == old:
        return
    if size < old:
        raise ValueError(f"the tokenizer has {size} tokens, fewer than the model's {old} rows")
    model.resize_token_embeddings(size, mean_resizing=False)
    for table in {
        id(m.weight): m
        for m in (model.get_input_embeddings(), model.get_output_embeddings())
        if m is not None
    }.values():
        table.weight[old:] = table.weight[:old].mean(0)
