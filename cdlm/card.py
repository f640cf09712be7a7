"""The model card (the Hub's ``README.md``) of a cdlm model folder, rendered from facts.

A card is written from a model's stored configs plus a dict of facts that training and
evaluation add as they measure them (training tokens, the val bound, gen-PPL), so that the card
never states a figure nobody measured: a missing figure is shown with the command that fills it.
Pure text: nothing here touches torch or the file system.
"""

from __future__ import annotations

import json
from typing import Any

FRONT_MATTER = """---
library_name: cdlm
pipeline_tag: text-generation
tags:
- diffusion-language-model
- cdlm
- {kind}
---
"""


def describe(node: Any) -> str:
    """A config node as a short call: ``MaskedProcess(t_min=0.001, schedule=LogLinear())``."""
    if isinstance(node, dict):
        target = node.get("_target_")
        args = ", ".join(
            f"{k}={describe(v)}"
            for k, v in node.items()
            if not k.startswith("_")
            and v is not None
            and k not in ("vocab_size", "mask_id", "base")
        )
        if target is None:
            return "{" + args + "}"
        return f"{str(target).rsplit('.', 1)[-1]}({args})"
    if isinstance(node, list):
        return "[" + ", ".join(describe(v) for v in node) + "]"
    return json.dumps(node) if isinstance(node, str) else str(node)


def _millions(n: float) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e5 else f"{n:,.0f}"


def _figure(value: Any, digits: int = 3) -> str:
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def sample_command(ref: str, config: dict) -> str:
    """The exact ``cdlm-sample`` command for this model (a label when it has labels)."""
    labels = config.get("labels") or []
    label = f" label={labels[0]}" if config.get("network", {}).get("num_classes") else ""
    return f"cdlm-sample ckpt={ref}{label} num_samples=4 seed=0"


def _measured(facts: dict, ref: str) -> list[str]:
    metrics = facts.get("metrics", {})
    fill = f"not measured yet: `cdlm-eval ckpt={ref}` measures it and updates this card"
    bound = metrics.get("bits_per_token")
    lines = ["| figure | value | how |", "|---|---|---|"]
    if bound is None:
        lines.append(f"| val bound (bits/token) | - | {fill} |")
    else:
        err = metrics.get("bits_per_token_std_error")
        value = _figure(bound) + (f" ± {err:.3f}" if err else "")
        lines.append(f"| val bound (bits/token) | {value} | {metrics.get('bound_how', '')} |")
    ppl = metrics.get("gen_ppl")
    if ppl is None:
        lines.append(f"| gen-PPL | - | {fill} (its scorer's install: `cdlm-eval --help`) |")
    else:
        lines.append(f"| gen-PPL | {ppl:.1f} | {metrics.get('gen_ppl_how', '')} |")
    for key, name in (("token_entropy_bits", "token entropy (bits)"), ("distinct_2", "distinct-2")):
        if key in metrics:
            lines.append(f"| {name} | {_figure(metrics[key])} | {metrics.get('gen_ppl_how', '')} |")
    if metrics.get("source"):
        lines.append(f"\nMeasured by `{metrics['source']}`.")
    return lines


def _start(base: dict) -> str:
    """How a model derived from a base started: its weights, or only its architecture."""
    return (
        "architecture only, trained from scratch" if base.get("weights") == "random" else "adapted"
    )


def render_card(config: dict, facts: dict, ref: str) -> str:
    """The README.md of a model folder. ``config``: the model's stored configs (process,
    network, seq_len, labels); ``facts``: ``process`` (kind), ``parameters``, ``vocab``,
    ``training`` and ``metrics`` (see ``cdlm.hub``); ``ref``: how users name the model (a
    folder or a Hub id), used in the commands."""
    kind = facts.get("process", "diffusion")
    training = facts.get("training", {})
    network = config.get("network", {})
    labels = config.get("labels") or []
    base = config.get("base")
    out = [FRONT_MATTER.format(kind=kind)]
    if base:  # the Hub's fields for a derived model: its base and the base's licence
        extra = f"base_model: {base.get('hub_id') or base['source']}\n" + (
            f"license: {base['license']}\n" if base.get("license") else ""
        )
        out[0] = out[0][: -len("---\n")] + extra + "---\n"
    out.append(f"# cdlm {kind} language model\n")
    out.append(
        f"A {kind} language model trained with cdlm. Weights, configs and tokenizer: "
        "`model.safetensors` (one pickle-free file, loadable alone); `config.json` and the "
        "tokenizer files are its readable and `AutoTokenizer` companions.\n"
    )
    out.append(f"## Use\n\n```bash\n{sample_command(ref, config)}\n```\n")
    out.append(
        f'```python\nimport cdlm\n\nmodel = cdlm.from_pretrained("{ref}")\n'
        f'model.save_pretrained("copy")  # or model.push_to_hub("you/name")\n```\n'
    )
    out.append("## Model\n\n| | |\n|---|---|")
    out.append(f"| process | `{describe(config.get('process', {}))}` |")
    out.append(f"| network | `{describe(network)}` |")
    if base:
        out.append(
            f"| base model | {base['name']} (`{base['source']}`), {_start(base)}; its licence: "
            f"{base.get('license') or 'not recorded, see the base'} |"
        )
    if "parameters" in facts:
        out.append(f"| parameters | {_millions(facts['parameters'])} |")
    out.append(f"| sequence length | {config.get('seq_len')} tokens |")
    if "vocab" in facts:
        out.append(f"| vocabulary | {facts['vocab']} tokens |")
    if labels and network.get("num_classes"):
        out.append(f"| labels | {', '.join(labels)} (classifier-free guidance: `guidance.scale`) |")
    if "sampler" in facts:
        out.append(f"| default sampler | `{facts['sampler']}` (cdlm-sample with no `sampler=`) |")
    if config.get("distillation"):
        out.append(f"| distillation | `{describe(config['distillation'])}` |")
    out.append("\n## Training\n\n| | |\n|---|---|")
    out.append(f"| recipe | `{training.get('command', 'not recorded')}` |")
    if "tokens" in training:
        out.append(
            f"| training tokens | {_millions(training['tokens'])} ({training.get('steps')} steps "
            f"of {training.get('batch_tokens')} tokens) |"
        )
    if "wall_seconds" in training:
        out.append(f"| wall time | {training['wall_seconds'] / 60:.1f} min |")
    out.append("\n## Measured\n")
    out += _measured(facts, ref)
    return "\n".join(out) + "\n"
