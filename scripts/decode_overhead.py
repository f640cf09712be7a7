"""How much of each decoding loop is the loop rather than the network (issue 51, item 4).

Times every token decoding loop of cdlm through the sampling driver (``cdlm.generation.generate``,
what ``cdlm-sample`` runs) against a bare loop over the same network and KV cache: one network
call and one float64 Gumbel-max draw at the decided positions per step, and nothing else. Both
run on one randomly initialised network of the quickstart's shape (d_model 256, 4 layers, 4
heads, 128 tokens, an 8,192-token vocabulary like the bundled BPE); a random network decides
nothing about speed except how many calls the adaptive loops make, so each ratio is per network
call: ``loop_over_bare`` = (loop seconds / loop calls) / (bare seconds / bare calls), the same as
the plain time ratio wherever the call counts agree (AR, block, ancestral).

    PYTHONPATH=. OMP_NUM_THREADS=1 python scripts/decode_overhead.py --out docs/results/decode_overhead

Runs and bare runs alternate (``--repeats`` of each after one warm-up of each), single-threaded,
so both see the same load on shared cores; each time is reported as min / median / max.
Writes ``<out>.json`` (one row per loop and batch) and ``<out>.md`` (the table).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from cdlm.generation import Plan, generate, named_sampler
from cdlm.model_file import Model
from cdlm.networks.transformer import Transformer
from cdlm.processes.autoregressive import AutoregressiveProcess
from cdlm.processes.block import BlockProcess
from cdlm.processes.block_masks import chunk_mask
from cdlm.processes.masked import MaskedProcess

EOS = 0
PREFIX = {"_target_": "cdlm.samplers.blockwise.PrefixCache"}
DUAL = {"_target_": "cdlm.samplers.blockwise.DualCache"}


class Ids:
    """Just enough tokenizer for the driver: ids as text."""

    eos_token_id = EOS

    def decode(self, ids, skip_special_tokens=True) -> str:
        return " ".join(map(str, ids))


@dataclass(frozen=True)
class Shape:
    vocab: int = 8192
    seq_len: int = 128
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    block: int = 4  # block diffusion's block size (the configs' default)
    masked_block: int = 16  # sampler.block_length of the cached masked rows
    masked_steps: int = 16  # steps of the masked rows (whole canvas, or shared by its blocks)


def network_for(process, shape: Shape, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    net = Transformer(
        **process.network_kwargs,
        d_model=shape.d_model,
        n_layers=shape.n_layers,
        n_heads=shape.n_heads,
        max_seq_len=shape.seq_len + 2,
    )
    with torch.no_grad():  # off adaLN-Zero's identity start, so attention does real work
        for p in net.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return net.eval()


def gumbel_max(logits: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """(N, V) -> (N,): the bare loops' exact draw, float64 Gumbel-max."""
    u = torch.rand(logits.shape, generator=generator, dtype=torch.float64)
    return (logits.double() - torch.log(-torch.log(u))).argmax(-1)


# --- the bare loops: one network call and one draw per step ------------------------------------


@torch.no_grad()
def bare_ar(net: Transformer, batch: int, length: int, g: torch.Generator) -> int:
    kv, zeros = net.new_cache(), torch.zeros(batch)
    x = torch.empty(batch, length, dtype=torch.long)
    token = torch.full((batch, 1), EOS, dtype=torch.long)
    for i in range(length):
        token = gumbel_max(net(token, zeros, cache=kv)[:, -1], g)[:, None]
        x[:, i] = token[:, 0]
    return length


def _reveal(seq: torch.Tensor, logits: torch.Tensor, at: torch.Tensor, mask_id: int, p: float, g):
    """Reveals each still-masked canvas position of ``at`` with probability p, drawing its token
    from ``logits`` (B, len(at), V); ``seq`` holds the shifted inputs, canvas token i at i + 1."""
    open_ = seq[:, at + 1] == mask_id
    chosen = open_ & (torch.rand(open_.shape, generator=g, dtype=torch.float64) < p)
    if chosen.any():
        rows, cols = chosen.nonzero(as_tuple=True)
        seq[rows, at[cols] + 1] = gumbel_max(logits[rows, cols], g)


@torch.no_grad()
def bare_block(
    net: Transformer, batch: int, length: int, k: int, steps: int, mask_id: int, g
) -> int:
    """Block diffusion's cached loop, shifted with tails (the configs' layout): per step one
    window call [clean positions the cache lacks, block, tail] and a draw in the block."""
    kv, zeros, calls = net.new_cache(), torch.zeros(batch), 0
    seq = torch.full((batch, length + 1), mask_id, dtype=torch.long)
    seq[:, 0] = EOS  # network inputs: [BOS, x_0, ..., x_{L-1}]
    for a in range(0, length, k):
        b = min(a + k, length)
        for j in range(steps):
            clean = torch.arange(kv.length, a)
            window = torch.arange(a, b + 1)
            mask = chunk_mask(kv.length, clean, len(window), k, True)
            inputs = seq[:, torch.cat([clean, window])]
            out = net(inputs, zeros, positions=torch.cat([clean, window]), attn_mask=mask, cache=kv)
            kv.truncate(a)
            calls += 1
            _reveal(seq, out[:, len(clean) : len(clean) + b - a], window[:-1], mask_id,
                    1.0 / (steps - j), g)  # fmt: skip
    return calls


@torch.no_grad()
def bare_masked(net: Transformer, batch: int, length: int, steps: int, mask_id: int, g) -> int:
    """Whole-canvas masked decoding (shifted): one call over the canvas per step."""
    zeros = torch.zeros(batch)
    seq = torch.full((batch, length + 1), mask_id, dtype=torch.long)
    seq[:, 0] = EOS
    at = torch.arange(length)
    for j in range(steps):
        out = net(seq, zeros)[:, :-1]
        _reveal(seq, out, at, mask_id, 1.0 / (steps - j), g)
    return steps


@torch.no_grad()
def bare_cached_masked(
    net: Transformer, batch: int, length: int, k: int, steps: int, mask_id: int, dual: bool, g
) -> int:
    """Fast-dLLM's caches (shifted): a block's first step rewrites the cache in one call, every
    other step reads it and runs the block (dual) or the block and the suffix (prefix)."""
    kv, zeros, calls, net_len = net.new_cache(), torch.zeros(batch), 0, length + 1
    seq = torch.full((batch, net_len), mask_id, dtype=torch.long)
    seq[:, 0] = EOS
    for a in range(0, length, k):
        b = min(a + k, length)
        window = torch.arange(a, b + 1)  # the block's predictors and its last token's input
        suffix = torch.arange(b + 1, net_len)
        for j in range(steps):
            if j == 0:
                kv.truncate(0)
                at = torch.cat([torch.arange(a), suffix, window]) if dual else torch.arange(net_len)
                out = net(seq[:, at], zeros, positions=at, cache=kv)
                kv.truncate(a + len(suffix) if dual else a)
                out = out[:, -len(window) :] if dual else out[:, a:]
            else:
                at = window if dual else torch.arange(a, net_len)
                with kv.read_only():
                    out = net(seq[:, at], zeros, positions=at, cache=kv)
            calls += 1
            _reveal(seq, out[:, : b - a], window[:-1], mask_id, 1.0 / (steps - j), g)
    return calls


# --- the rows -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Loop:
    """One decoding loop: its name, process kind, sampler (``conf/sampler/<sampler>.yaml`` with
    ``options``), the plan's steps, and its bare loop (network, batch, generator) -> calls."""

    name: str
    kind: str
    sampler: str
    options: dict
    steps: int
    bare: Callable


def loops(s: Shape) -> list[Loop]:
    mask = s.vocab - 1
    m_blocks = s.seq_len // s.masked_block
    per_masked_block = s.masked_steps // m_blocks if m_blocks > 1 else s.masked_steps
    masked_steps = max(per_masked_block, 1) * m_blocks

    def cached(cache: dict):
        opts = {"block_length": s.masked_block, "cache": cache, "stop_at_eos": False}
        bare = lambda n, b, g: bare_cached_masked(  # noqa: E731
            n, b, s.seq_len, s.masked_block, masked_steps // m_blocks, mask, cache is DUAL, g
        )
        return opts, bare

    rows = [
        Loop("ar", "autoregressive", "ar", {"stop_at_eos": False}, s.seq_len,
             lambda n, b, g: bare_ar(n, b, s.seq_len, g)),
        Loop(f"block ({s.block} steps/block)", "block", "block",
             {"steps_per_block": s.block, "stop_at_eos": False}, s.seq_len,
             lambda n, b, g: bare_block(n, b, s.seq_len, s.block, s.block, mask, g)),
        Loop("speculative", "block", "speculative", {"stop_at_eos": False}, s.seq_len,
             lambda n, b, g: bare_block(n, b, s.seq_len, s.block, 1, mask, g)),
        Loop("ancestral", "masked", "ancestral", {}, s.masked_steps,
             lambda n, b, g: bare_masked(n, b, s.seq_len, s.masked_steps, mask, g)),
        Loop("cached_ancestral", "masked", "cached_ancestral", {}, s.masked_steps,
             lambda n, b, g: bare_masked(n, b, s.seq_len, s.masked_steps, mask, g)),
    ]  # fmt: skip
    for rule in ("threshold", "confidence"):
        for name, cache in (("prefix", PREFIX), ("dual", DUAL)):
            opts, bare = cached(cache)
            rows.append(Loop(f"{rule}, cache={name}", "masked", rule, opts, masked_steps, bare))
    return rows


def process_of(kind: str, s: Shape):
    mask = s.vocab - 1
    if kind == "autoregressive":
        return AutoregressiveProcess(vocab_size=s.vocab, bos_id=EOS)
    if kind == "block":
        return BlockProcess(
            vocab_size=s.vocab, mask_id=mask, block_size=s.block, eos_id=EOS, shift=True,
            causal_clean=True,
        )  # fmt: skip
    return MaskedProcess(vocab_size=s.vocab, mask_id=mask, eos_id=EOS, shift=True)


def spread(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def measure(loop: Loop, batch: int, s: Shape, repeats: int) -> dict:
    process = process_of(loop.kind, s)
    net = network_for(process, s)
    model = Model(process, net, Ids(), {})
    sampler = named_sampler(loop.sampler, **loop.options)
    plan = Plan(num_samples=batch, seq_len=s.seq_len, steps=loop.steps, seed=0, cut_at_eos=False)
    loop_t, bare_t, loop_calls, bare_calls = [], [], 0, 0
    for r in range(repeats + 1):  # the first of each: warm-up, not kept
        gen = generate(model, sampler, plan)
        g = torch.Generator().manual_seed(r)
        start = time.perf_counter()
        bare_calls = loop.bare(net, batch, g)
        bare = time.perf_counter() - start
        if r:
            loop_t.append(gen.wall_seconds)
            bare_t.append(bare)
            loop_calls = gen.nfe
    tokens = batch * s.seq_len
    per_call = statistics.median(loop_t) / loop_calls
    return {
        "loop": loop.name,
        "sampler": loop.sampler,
        "batch": batch,
        "vocab": s.vocab,
        "seq_len": s.seq_len,
        "loop_over_bare": per_call / (statistics.median(bare_t) / bare_calls),
        "loop_calls": loop_calls,
        "bare_calls": bare_calls,
        "loop_seconds": spread(loop_t),
        "bare_seconds": spread(bare_t),
        "loop_tokens_per_s": spread([tokens / t for t in loop_t]),
        "bare_tokens_per_s": spread([tokens / t for t in bare_t]),
        "repeats": repeats,
    }


def markdown(rows: list[dict]) -> str:
    head = (
        "| loop | batch | V | loop_over_bare | calls (loop / bare) | loop tokens/s min / median"
        " / max | bare tokens/s min / median / max |\n|---|---|---|---|---|---|---|\n"
    )

    def mmm(d: dict) -> str:
        return f"{d['min']:.0f} / {d['median']:.0f} / {d['max']:.0f}"

    lines = [
        f"| {r['loop']} | {r['batch']} | {r['vocab']} | {r['loop_over_bare']:.2f} | "
        f"{r['loop_calls']} / {r['bare_calls']} | {mmm(r['loop_tokens_per_s'])} | "
        f"{mmm(r['bare_tokens_per_s'])} |"
        for r in rows
    ]
    return head + "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("decode_overhead"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--vocab", type=int, nargs="+", default=[8192])
    parser.add_argument("--seq-len", type=int, default=Shape.seq_len)
    parser.add_argument("--only", nargs="*", default=None, help="loop names to run (prefixes)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for vocab in args.vocab:
        s = Shape(vocab=vocab, seq_len=args.seq_len)
        for loop in loops(s):
            if args.only and not any(loop.name.startswith(o) for o in args.only):
                continue
            for batch in args.batches:
                row = measure(loop, batch, s, args.repeats)
                rows.append(row)
                print(
                    f"{row['loop']:<28} B={batch:<3} V={vocab:<5} loop/bare "
                    f"{row['loop_over_bare']:.2f}  calls {row['loop_calls']}/{row['bare_calls']}",
                    flush=True,
                )
    meta = {
        "shape": asdict(Shape(seq_len=args.seq_len)),
        "load_average_at_end": os.getloadavg(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    args.out.with_suffix(".md").write_text(markdown(rows))
    print(markdown(rows))


if __name__ == "__main__":
    main()
