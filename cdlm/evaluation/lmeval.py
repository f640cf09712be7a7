"""A cdlm model as an lm-evaluation-harness model, registered as ``cdlm`` (docs/guide/evaluation.md).

Python: ``lm_eval.simple_evaluate(model=CdlmLM(pretrained=...), tasks=[...])``, or
``model="cdlm"`` with ``model_args`` once this module is imported. Command line: lm-eval 0.4.13
finds models only in its own registry (no entry points), so ``cdlm-lm-eval`` imports this module
and hands its arguments to lm-eval's own CLI: ``cdlm-lm-eval --model cdlm --model_args
pretrained=PATH,sampler=NAME,steps=N,mc_draws=K --tasks ...``. The scores themselves are in
``cdlm.evaluation.lmeval_scores``; lm-eval is imported here alone, so cdlm runs without it.
"""

from __future__ import annotations

import logging
import zlib
from typing import Any

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from cdlm.evaluation.lmeval_scores import (
    continuation_score,
    cut_at_stops,
    encode,
    rolling_nats,
    sample_continuations,
    split_pair,
)
from cdlm.generation import choose, named_sampler
from cdlm.model_file import Model, load_model
from cdlm.progress import progress
from cdlm.rng import member_seed

log = logging.getLogger(__name__)

DEFAULT_MAX_GEN_TOKS = 256
GENERATE_BATCH = 16  # different prompts per sampler call when lm-eval's batch size is auto
# generation options that lm-eval tasks pass and a cdlm sampler decides by itself
SAMPLER_DECIDES = ("do_sample", "temperature", "top_p", "top_k")


@register_model("cdlm")
class CdlmLM(LM):
    """lm-eval's three request types on a cdlm model (``cdlm.evaluation.lmeval_scores``).

    Args:
        pretrained: a model file, model folder, Hub id or ``hf:`` base, or a loaded ``Model``
            (a world's oracle: ``load_model("world:<name>", process=...)``).
        sampler: the ``conf/sampler`` name for ``generate_until`` (None: the model's default).
        steps: sampling steps (None: the default, or a distilled student's own).
        mc_draws: corruptions averaged per diffusion likelihood (AR: exact, one pass).
        seed: the base seed of every draw; a request's stream is seeded by its context, so the
            choices of one question share their draws (common random numbers).
        device: where the model runs (a CUDA device where there is none: the CPU, with a warning,
            since lm-eval's command line asks for ``cuda:0`` unless told otherwise).
        batch_size: at most this many draws per network call (lm-eval's ``--batch_size``),
            and different prompts per ``generate_until`` sampler call (default 16).
    """

    def __init__(
        self,
        pretrained: str | Model,
        sampler: str | None = None,
        steps: int | None = None,
        mc_draws: int = 32,
        seed: int = 0,
        device: str | None = None,
        batch_size: int | str | None = None,
        max_batch_size: int | None = None,
    ) -> None:
        super().__init__()
        if mc_draws < 1:
            raise ValueError(f"mc_draws must be >= 1, got {mc_draws}")
        if isinstance(pretrained, Model):
            self.model = pretrained
        else:
            self.model = load_model(str(pretrained), _device(device))
        choice = choose(
            self.model.process,
            self.model.config,
            None if steps is None else int(steps),
            None if sampler is None else named_sampler(str(sampler)),
        )
        self.sampler, self.steps = choice.sampler, choice.steps
        self.mc_draws, self.seed = int(mc_draws), int(seed)
        self.draw_batch = _per_call(batch_size, self.mc_draws)
        self.generate_batch = _per_call(batch_size, GENERATE_BATCH)

    def _seed(self, context: str) -> int:
        """The request's seed: the base seed mixed with its context (not its place in a run)."""
        return member_seed(self.seed, zlib.crc32(context.encode("utf-8")))

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """(log p(continuation | context), is_greedy) per request; see ``continuation_score``."""
        out = []
        for request in progress(requests, "lm-eval loglikelihood", enabled=not disable_tqdm):
            context, continuation = request.args
            head, tail = split_pair(self.model, context, continuation)
            score = continuation_score(
                self.model,
                head,
                tail,
                draws=self.mc_draws,
                seed=self._seed(context),
                batch_size=self.draw_batch,
            )
            out.append((-score.nats, score.greedy))
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """log p(text) per request, summed over windows of the model's ``seq_len`` tokens."""
        out = []
        for request in progress(requests, "lm-eval rolling", enabled=not disable_tqdm):
            (text,) = request.args[:1]
            ids = encode(self.model, text)
            out.append(-rolling_nats(self.model, ids, draws=self.mc_draws, seed=self._seed(text)))
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """A sampled continuation per request, cut at the first of its ``until`` strings and at
        most ``max_gen_toks`` tokens long (fewer where the model's ``seq_len`` leaves less); the
        prompts are batched, request r drawing from seed ``member_seed(seed, r)`` (``generate_rows``)."""
        asked = []
        for request in requests:
            context, options = request.args
            stops, most = _generation_options(options)
            asked.append((context, most, stops))
        texts = sample_continuations(
            self.model,
            self.sampler,
            self.steps,
            [(context, most) for context, most, _ in asked],
            self.seed,
            self.generate_batch,
        )
        return [cut_at_stops(text, stops) for text, (_, _, stops) in zip(texts, asked, strict=True)]


def _device(name: str | None) -> torch.device:
    """``name`` as a device; a CUDA one falls back to the CPU on a machine without CUDA."""
    if name is None or name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        log.warning("model=cdlm: device %s asked for, but CUDA is not available: using cpu", name)
        return torch.device("cpu")
    return device


def _per_call(batch_size: int | str | None, default: int) -> int:
    """Items per call (likelihood draws, or prompts to generate from): lm-eval's
    ``--batch_size`` when a number, else ``default``."""
    if batch_size is None or str(batch_size).startswith("auto"):
        return default
    size = int(batch_size)
    if size < 1:
        raise ValueError(f"batch_size must be >= 1, got {size}")
    return size


def _generation_options(options: dict[str, Any]) -> tuple[list[str], int]:
    """(stop strings, max_gen_toks) of a request's ``gen_kwargs``; options a cdlm sampler sets
    itself are named once in the log, unknown ones refused."""
    options = dict(options or {})
    until = options.pop("until", [])
    stops = [until] if isinstance(until, str) else list(until)
    most = int(options.pop("max_gen_toks", DEFAULT_MAX_GEN_TOKS))
    decided = [k for k in SAMPLER_DECIDES if k in options]
    for key in decided:
        options.pop(key)
    if options:
        raise ValueError(
            f"unknown gen_kwargs for model=cdlm: {', '.join(sorted(options))}; it takes until, "
            f"max_gen_toks ({', '.join(SAMPLER_DECIDES)} are the sampler's to decide)"
        )
    if decided:
        log.info("model=cdlm: the sampler decides %s; gen_kwargs ignored", ", ".join(decided))
    return stops, most


def run_cli() -> None:
    """lm-eval's own command line (sys.argv), this module's ``cdlm`` model registered."""
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()
