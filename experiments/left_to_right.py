"""Left-to-right conditional CE of diffusion checkpoints: what left-to-right decoding
(``sampler=rolling``, masked ``block_length=1``) asks of a model, teacher-forced on val text.

    python experiments/left_to_right.py CKPT [CKPT ...]

At each scored position k of a val sequence the tokens before k are clean (masked: visible;
gaussian: t = 0) and the tokens from k on are hidden (masked: [MASK]; gaussian: t = 1), and the
model's CE (bits) and accuracy at k are averaged over 8 positions x the first 48 val sequences.
An AR model's val NLL is the matching number for a next-token predictor.
"""

from __future__ import annotations

import argparse
import math

import torch

from cdlm import rng
from cdlm.likelihood.evaluate import corpus_split
from cdlm.model_file import load_model

POSITIONS = (8, 24, 40, 56, 72, 88, 104, 120)


@torch.no_grad()
def left_to_right(ckpt: str, sequences: int = 48) -> dict:
    model = load_model(ckpt)
    process, denoiser = model.process, model.denoiser
    val = corpus_split(model).val_set.tokens[:sequences]
    n, length = val.shape
    generator = rng.generator(0)
    nats, hits = 0.0, 0
    for k in POSITIONS:
        if process.kind == "gaussian":
            t = torch.ones(n, length)
            t[:, :k] = 0.0
            x0 = process.embedding(val)
            x = process.corrupt(x0, t, torch.randn(x0.shape, generator=generator))
        elif process.kind == "masked":
            x = val.clone()
            x[:, k:] = process.mask_id
            t = torch.full((n,), (length - k) / length)
        else:
            raise ValueError(f"left-to-right CE needs a diffusion model, got {process.kind!r}")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = denoiser(x, t).logits[:, k].float()
        logp = torch.log_softmax(logits, -1)
        nats -= logp.gather(-1, val[:, k : k + 1]).sum().item()
        hits += (logp.argmax(-1) == val[:, k]).sum().item()
    scored = n * len(POSITIONS)
    return {"ckpt": ckpt, "bits": nats / scored / math.log(2), "accuracy": hits / scored}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("ckpts", nargs="+")
    for ckpt in parser.parse_args().ckpts:
        r = left_to_right(ckpt)
        print(f"{r['ckpt']}: {r['bits']:.3f} bits, accuracy {r['accuracy']:.3f}")


if __name__ == "__main__":
    main()
