"""Left-to-right conditional CE of diffusion checkpoints: what left-to-right decoding
(``sampler=rolling``, masked ``block_length=1``) asks of a model, teacher-forced on val text.

    python experiments/left_to_right.py CKPT [CKPT ...]

At each scored position k of a val sequence the tokens before k are clean (t = 0) and the
tokens from k on are hidden (t = 1: [MASK] for a masked model, noise for a gaussian one), drawn
by the process's own ``corrupt``; the model's CE (bits) and accuracy at k are averaged over 8
positions (at 128 tokens: 8, 24, ..., 120) x the first 48 val sequences. A position that the
draw left visible (a masked schedule keeps a share eps = 1e-3 of tokens at t = 1) is not
scored. An AR model's val NLL is the matching number for a next-token predictor.
"""

from __future__ import annotations

import argparse
import math

import torch

from cdlm import rng
from cdlm.likelihood.evaluate import corpus_split
from cdlm.model_file import load_model


def positions(length: int, count: int = 8) -> list[int]:
    """``count`` positions at the middles of equal stretches of the sequence."""
    return [(2 * i + 1) * length // (2 * count) for i in range(count)]


@torch.no_grad()
def left_to_right(ckpt: str, sequences: int = 48) -> dict:
    model = load_model(ckpt)
    process, denoiser = model.process, model.denoiser
    if not process.noise_levels:
        raise ValueError(f"left-to-right CE needs a diffusion model, got {process.kind!r}")
    val = corpus_split(model).val_set.tokens[:sequences]
    n, length = val.shape
    generator = rng.generator(0)
    nats, hits, scored = 0.0, 0, 0
    for k in positions(length):
        t = torch.ones(n, length)
        t[:, :k] = 0.0
        c = process.corrupt(val, t, generator)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = denoiser(c.x_t, c.t).logits[:, k].float()
        hidden = c.noisy[:, k]
        logp = torch.log_softmax(logits[hidden], -1)
        truth = val[hidden, k]
        nats -= logp.gather(-1, truth[:, None]).sum().item()
        hits += (logp.argmax(-1) == truth).sum().item()
        scored += int(hidden.sum())
    return {"ckpt": ckpt, "bits": nats / scored / math.log(2), "accuracy": hits / scored}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("ckpts", nargs="+")
    for ckpt in parser.parse_args().ckpts:
        r = left_to_right(ckpt)
        print(f"{r['ckpt']}: {r['bits']:.3f} bits, accuracy {r['accuracy']:.3f}")


if __name__ == "__main__":
    main()
