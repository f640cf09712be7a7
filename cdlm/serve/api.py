"""The model behind ``cdlm-serve``: a ``litserve.LitAPI`` that draws a batch of requests through
``cdlm.generation.rows.generate_rows``.

LitServe gathers up to ``max_batch_size`` requests within ``batch_timeout``; the requests that
share their ``Options`` (sampler, steps, temperature, guidance scale) go into one sampler call,
each with its own seed (``generate_rows(seeds=...)``), so each comes out token for token as
``cdlm-sample`` draws it alone. ``predict`` yields one list of chunks per sampler step (one chunk
per request of the batch): first one that says whether the request was accepted (a refused one
carries its one-line ``error``, answered with HTTP 400 while the rest of the batch goes on), then
at each step the text a streaming request's row has committed since the last (and its canvas,
with ``stream_canvas``), and last the rest of each completion with ``done``.
"""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import litserve
import torch
from omegaconf import OmegaConf

from cdlm import config_dir
from cdlm.canvas import Recorder
from cdlm.canvas.html import frame_data
from cdlm.canvas.record import Frame
from cdlm.canvas.terminal import Pieces
from cdlm.generation import Plan, RowsGeneration, choose, generate_rows, named_sampler
from cdlm.generation.choice import with_temperature
from cdlm.generation.inputs import row_layouts
from cdlm.guidance import Guidance
from cdlm.model_file import Model, load_model
from cdlm.samplers import check_compatible
from cdlm.serve.requests import Ask, Options, chat_prompt, read_ask, sent

# cdlm-sample's own defaults for what a request cannot set, so a response equals its sample
SAMPLE = OmegaConf.load(config_dir() / "sample.yaml")


class Stopped(Exception):
    """Every request of a sampler call has gone (its client disconnected)."""


@dataclass
class Stream:
    """One accepted request in a batch: its ``Ask``, where its completion starts on the canvas
    (``start``; None: an infill row, whose text comes at the end), its canvas length, the text
    sent so far and whether its client has gone."""

    ask: Ask
    start: int | None = None
    length: int = 0
    sent: str = ""
    usage: dict[str, int] = field(default_factory=dict)
    gone: bool = False


class CdlmAPI(litserve.LitAPI):
    """Serves the model ``ckpt`` on ``device``, loaded with ``load_model(ckpt, device,
    **options)`` in LitServe's worker process (``setup``), so no weights are pickled into it;
    ``chat_template`` replaces the tokenizer's. ``gone``: a dict shared with the HTTP side
    (``cdlm.serve.spec``) holding the ids of requests whose clients disconnected."""

    def __init__(
        self,
        ckpt: str,
        device: str,
        options: dict[str, Any],
        gone: Any,
        chat_template: str | None = None,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.ckpt, self.device, self.options = ckpt, device, options
        self.gone, self.chat_template = gone, chat_template
        self.model: Model | None = None

    def setup(self, device: str) -> None:
        """Loads the model on cdlm's ``device=`` (LitServe's own ``device``, a CPU slot, is not
        used: it would drop a ``cuda:N``)."""
        self.model = load_model(self.ckpt, torch.device(self.device), **self.options)
        if self.chat_template is not None:
            self.model.tokenizer.chat_template = self.chat_template
        self.pieces = Pieces(self.model.tokenizer)

    def decode_request(self, request) -> Ask | str:
        """The request's ``Ask``, or its one-line refusal: raising here would fail the whole
        batch it was gathered into."""
        try:
            ask = read_ask(sent(request), lambda chat: chat_prompt(self.model.tokenizer, chat))
            self._check(ask)
        except ValueError as e:  # UsageError, and the library's own one-line refusals
            return str(e).splitlines()[0]
        return ask

    def _check(self, ask: Ask) -> None:
        """What would fail only inside the sampler call: a sampler of another process, a canvas
        longer than the model's, prompt guidance on a causal model."""
        _, plan = self._drawing(ask.options)
        row_layouts(self.model, plan.seq_len, [ask.row], what="request")
        if plan.guidance.guides_prompt(True) and self.model.process.sequential:
            raise ValueError(
                "guidance_scale needs a process whose network sees the whole canvas (masked, "
                "block, gaussian); the autoregressive baseline reads the prompt as context only"
            )

    def _drawing(self, options: Options) -> tuple[Any, Plan]:
        """The sampler and plan of ``options``, made as ``cdlm-sample`` makes them."""
        model = self.model
        chosen = named_sampler(options.sampler) if options.sampler else None
        choice = choose(model.process, model.config, options.steps, chosen)
        sampler = choice.sampler
        denoising = {k: SAMPLE[k] for k in ("temperature", "clamp", "self_cond_scale")}
        if options.temperature is not None:  # gaussian: the x0 softmax's; else the draws'
            if model.process.continuous:
                denoising["temperature"] = options.temperature
            else:
                sampler = with_temperature(sampler, options.temperature)
        check_compatible(sampler, model.process.kind)
        plan = Plan(
            num_samples=1,
            seq_len=model.config["seq_len"],
            steps=choice.steps,
            grid=SAMPLE.grid,
            rounding=SAMPLE.rounding,
            guidance=Guidance(None, options.guidance_scale, "auto"),
            denoising=denoising,
        )
        return sampler, plan

    def batch(self, inputs: list) -> list:
        return list(inputs)

    def unbatch(self, output: Iterator) -> Iterator:
        return output

    def predict(self, x) -> Iterator:
        """One list of chunks per step (one chunk per request); a lone request (``max_batch_size``
        1: LitServe's unbatched loop) gets its chunk itself."""
        batched = isinstance(x, list)
        for chunks in self._chunks(x if batched else [x]):
            yield chunks if batched else chunks[0]

    def encode_response(self, output: Iterator) -> Iterator:
        yield from output

    def _chunks(self, asks: list) -> Iterator[list[dict]]:
        streams = [None if isinstance(a, str) else Stream(a) for a in asks]
        yield [{"error": a if isinstance(a, str) else None} for a in asks]
        groups: dict[Options, list[int]] = {}
        for k, s in enumerate(streams):
            if s is not None:
                groups.setdefault(s.ask.options, []).append(k)
        print(
            f"cdlm-serve: batch of {len(asks)} requests, {len(groups)} sampler calls "
            f"(sizes {sorted(len(g) for g in groups.values())})",
            file=sys.stderr,
            flush=True,
        )
        for options, members in groups.items():
            for frame, gen in self._draw(options, [streams[k] for k in members]):
                chunks: list[dict] = [{} for _ in asks]
                for j, k in enumerate(members):
                    chunks[k] = self._chunk(streams[k], frame, j, gen)
                if any(chunks):
                    yield chunks
        for s in streams:
            if s is not None and s.gone:
                self.gone.pop(s.ask.id, None)

    def _draw(self, options: Options, members: list[Stream]) -> Iterator[tuple]:
        """Runs one sampler call in a thread; yields ``(frame, None)`` at every step where a
        member streams, then ``(None, generation)``. The call stops at the next step once every
        member's client has gone."""
        sampler, plan = self._drawing(options)
        rows = [s.ask.row for s in members]
        layouts = row_layouts(self.model, plan.seq_len, rows, "request")
        for s, layout in zip(members, layouts, strict=True):
            fixed = sum(not e for e in layout.editable)
            s.start = fixed if s.ask.row.prompt is not None else None
            s.length = len(layout.ids)
            s.usage = {"prompt_tokens": fixed, "completion_tokens": s.length - fixed}
            s.usage["total_tokens"] = s.length
        steps: queue.Queue = queue.Queue(maxsize=1)  # the call waits for its reader: a
        # client that leaves is noticed within a step of where its stream is

        made = [0]  # sampler steps made

        def check() -> None:
            made[0] += 1
            for s in members:
                s.gone = s.gone or s.ask.id in self.gone
            if all(s.gone for s in members):
                raise Stopped(
                    f"cdlm-serve: stopped a sampler call of {len(members)} requests at step "
                    f"{made[0]} of {plan.steps}: every client left"
                )

        def on_frame(frame: Frame, _trajectory) -> None:
            check()
            steps.put((frame, None))

        # a frame (argmax and confidences of the whole batch) only where a member streams
        streaming = any(s.ask.stream for s in members)
        callback = Recorder(self.model.process, on_frame=on_frame) if streaming else None

        def work() -> None:
            try:
                gen = generate_rows(
                    self.model,
                    sampler,
                    plan,
                    rows,
                    callback=callback or (lambda _info: check()),
                    what="request",
                    seeds=[s.ask.seed for s in members],
                )
                steps.put((None, gen))
            except Exception as e:  # Stopped, or raised again in predict (LitServe: HTTP 500)
                steps.put((None, e))

        threading.Thread(target=work, daemon=True).start()
        while True:
            frame, gen = steps.get()
            if isinstance(gen, Stopped):
                print(gen, file=sys.stderr, flush=True)
                return
            if isinstance(gen, Exception):
                raise gen
            yield frame, gen
            if gen is not None:
                return

    def _chunk(self, s: Stream, frame: Frame | None, j: int, gen: RowsGeneration | None) -> dict:
        """What request ``s`` (row ``j`` of its call) has to send now (empty: nothing): at a
        step, the new text of its committed tokens and its canvas; at the end, the rest of its
        completion."""
        if s.gone:
            return {}
        if gen is not None:
            text = gen.rows[j].completion
            rest = text[len(s.sent) :] if text.startswith(s.sent) else text
            return {"content": rest, "done": True} | s.usage
        if not s.ask.stream:
            return {}
        chunk = {"content": self._committed(s, frame, j)}
        if s.ask.stream_canvas:
            canvas = frame_data(frame, j, s.length)
            canvas["pieces"] = [self.pieces(t) for t in canvas["tokens"]]
            canvas["fixed"] = [s.start is not None and i < s.start for i in range(s.length)]
            chunk["canvas"] = canvas
        return chunk if chunk["content"] or s.ask.stream_canvas else {}

    def _committed(self, s: Stream, frame: Frame, j: int) -> str:
        """The new text of the tokens decided after the prompt, up to the first undecided one
        (nothing for an infill row, or where a token was revised)."""
        if s.start is None or self.model.process.continuous:
            return ""  # a gaussian row commits nothing before its last step
        tok = self.model.tokenizer
        decided = frame.decided[j, s.start : s.length].tolist()
        ids = frame.tokens[j, s.start : s.length].tolist()
        ids = ids[: decided.index(False) if False in decided else len(ids)]
        if tok.eos_token_id in ids:
            ids = ids[: ids.index(tok.eos_token_id)]
        text = tok.decode(ids, skip_special_tokens=True)
        if text.endswith("\ufffd") or not text.startswith(s.sent):
            return ""  # half a character, or a revised token: wait
        delta, s.sent = text[len(s.sent) :], text
        return delta
