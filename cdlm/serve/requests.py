"""What one request to ``cdlm-serve`` asks for, read from the fields the client sent.

The cdlm sampling options travel in the request body beside the OpenAI fields (the ``openai``
client's ``extra_body``, vLLM's ``vllm_xargs``). They are checked with cdlm-sample's own rule
objects (``cdlm.validation``), so a bad value is refused in the line the command would print;
an unknown field is refused too, never silently ignored: a typo such as ``step`` would
otherwise sample with the defaults and look like a bad model.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from cdlm import config_dir
from cdlm.generation import Row
from cdlm.validation import (
    FLAG,
    OPTIONAL_COUNT,
    POSITIVE,
    SCALE,
    SEED,
    Choice,
    Rule,
    UsageError,
    require,
)

SAMPLERS = tuple(sorted(p.stem for p in (config_dir() / "sampler").glob("*.yaml")))
RULES: dict[str, Rule] = {
    "sampler": Choice(SAMPLERS, nullable=True),
    "steps": OPTIONAL_COUNT,
    "seed": SEED,
    "temperature": POSITIVE,
    "guidance_scale": SCALE,
    "max_tokens": OPTIONAL_COUNT,
    "stream": FLAG,
    "stream_canvas": FLAG,
}
TEXTS = ("messages", "prompt", "infill")  # what a request samples from: one of them
PASSED = ("model", "user", "metadata", "n")  # read by the spec, not by sampling
ID = "cdlm_request_id"  # set by the spec on every request it queues (a client's is replaced)


@dataclass(frozen=True)
class Options:
    """What the rows of one sampler call share; requests that differ here are drawn in separate
    calls of the same batch. None: cdlm-sample's default (the process's sampler, 64 steps,
    temperature 1)."""

    sampler: str | None = None
    steps: int | None = None
    temperature: float | None = None
    guidance_scale: float = 1.0


@dataclass(frozen=True)
class Ask:
    """One request as cdlm draws it: its row, the options it shares with others, its own seed
    (drawn at random when the client gave none), whether it streams (text; and its canvas at
    every step) and the id the spec gave it."""

    row: Row
    options: Options
    seed: int
    stream: bool = False
    stream_canvas: bool = False
    id: str = ""


def sent(request: Any) -> dict[str, Any]:
    """The fields a client sent: OpenAI's that it set (pydantic's defaults, such as the spec's
    temperature 0.7, would change the sample) and the extras beside them."""
    fields = {k: getattr(request, k) for k in request.model_fields_set}
    return fields | dict(request.model_extra or {})


def read_ask(fields: dict[str, Any], prompt_of_chat) -> Ask:
    """The ``Ask`` of a request's ``fields``; ``prompt_of_chat(messages)`` renders a chat. A
    ``UsageError`` in one line for an unknown field, a bad value or a missing text."""
    fields = dict(fields)
    rid = str(fields.pop(ID, ""))
    known = (*RULES, *TEXTS, *PASSED)
    for key in fields:
        require(key in known, f"unknown field {key!r}; valid: {', '.join(sorted(known))}")
    n = fields.get("n", 1)
    require(n == 1, f"n must be 1 (one sample a request), got {n!r}")
    for key, rule in RULES.items():
        if key in fields:
            rule.check(key, fields[key])
    stream, canvas = fields.get("stream", False), fields.get("stream_canvas", False)
    require(not canvas or stream, "stream_canvas needs stream: true")
    texts = [k for k in TEXTS if fields.get(k) is not None]
    require(len(texts) == 1, f"give exactly one of {', '.join(TEXTS)} (got {texts})")
    text = fields[texts[0]]
    if texts[0] == "messages":
        text = prompt_of_chat(text)
    require(isinstance(text, str), f"{texts[0]} must be a string, got {type(text).__name__}")
    infill = texts[0] == "infill"
    require(
        not (infill and fields.get("max_tokens") is not None),
        "max_tokens counts the tokens after a prompt; an infill template sets its own length",
    )
    row = Row(infill=text) if infill else Row(prompt=text, max_new_tokens=fields.get("max_tokens"))
    options = Options(
        fields.get("sampler"),
        fields.get("steps"),
        fields.get("temperature"),
        float(fields.get("guidance_scale", 1.0)),
    )
    seed = fields["seed"] if "seed" in fields else secrets.randbits(31)
    return Ask(row, options, seed, stream, canvas, rid)


def chat_prompt(tokenizer, messages: list) -> str:
    """The chat as the model's template renders it, ending where the assistant's reply starts;
    a ``UsageError`` where the tokenizer has no template (``chat_template=`` sets one)."""
    require(
        getattr(tokenizer, "chat_template", None) is not None,
        "this model's tokenizer has no chat template; use /v1/completions, or start "
        "cdlm-serve with chat_template=...",
    )
    chat = [{"role": m.role, "content": m.content} for m in messages]
    for m in chat:
        require(isinstance(m["content"], str), "message content must be text")
    try:
        return tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    except Exception as e:  # a template's own error (jinja2 raises its own kinds)
        raise UsageError(f"the chat template failed: {e}") from None
