"""Text templates with fixed and editable regions, for prompting, infilling and editing.

A template is plain text in which ``[[N]]`` marks a blank of N tokens and ``[[some text]]`` an
editable span that starts from ``some text``; everything else is fixed. ``build_layout`` turns the
regions into initial token ids plus a per-position "may write" mask for the sampler (a canvas of
exactly those regions: an infill or edit template ends where it ends, a prompt ends with the
open tail that is its continuation), and
``assemble`` turns the sampled ids back into text with a map from input regions to output
regions. Fixed regions are written back from the template itself, so they come back
byte-identical whatever the tokenizer's decode does; the sampled ids are still checked against
the canvas so that a sampler which overwrote a fixed position is caught, not hidden.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

OPEN, CLOSE = "[[", "]]"
_BLANK = re.compile(r"[0-9]+")


@dataclass
class Segment:
    """One region of a template: fixed text, a blank, or an editable span.

    ``start``/``end`` is the character span in the template (brackets included for editable
    regions), so the output can point back at what the user wrote.
    """

    text: str  # the region's template text ('' for a blank)
    editable: bool
    blank_tokens: int | None  # N for [[N]] (and the laid-out tail), else None
    start: int
    end: int
    tail: bool = False  # a blank that takes the canvas's room left over (after a prompt)


def parse_template(template: str) -> list[Segment]:
    """Splits an infill/edit template into regions (one parser for both: the sampler decides
    whether an editable span is regenerated from scratch or re-noised from its text)."""
    segments: list[Segment] = []
    i = fixed_start = 0
    while i < len(template):
        if template.startswith(OPEN, i):
            close = template.find(CLOSE, i + 2)
            if close == -1:
                raise ValueError(f"unbalanced template: '[[' at character {i} is never closed")
            nested = template.find(OPEN, i + 2, close)
            if nested != -1:
                raise ValueError(
                    f"nested brackets in template: '[[' at character {nested} is inside "
                    f"the region opened at character {i}"
                )
            content = template[i + 2 : close]
            if not content:
                raise ValueError(f"empty region '[[]]' in template at character {i}")
            if i > fixed_start:
                segments.append(Segment(template[fixed_start:i], False, None, fixed_start, i))
            if _BLANK.fullmatch(content):
                if int(content) == 0:
                    raise ValueError(
                        f"blank of zero tokens '[[{content}]]' in template at character {i}"
                    )
                segments.append(Segment("", True, int(content), i, close + 2))
            else:
                segments.append(Segment(content, True, None, i, close + 2))
            i = fixed_start = close + 2
        elif template.startswith(CLOSE, i):
            raise ValueError(f"unbalanced template: stray ']]' at character {i} with no '[['")
        else:
            i += 1
    if fixed_start < len(template):
        segments.append(Segment(template[fixed_start:], False, None, fixed_start, len(template)))
    return segments


def prompt_template(prompt: str) -> list[Segment]:
    """A prompt is a fixed prefix, taken literally (brackets in it are plain text), and a tail:
    the continuation after it is what gets generated, as long as the canvas allows."""
    end = len(prompt)
    return [Segment(prompt, False, None, 0, end), Segment("", True, None, end, end, tail=True)]


@dataclass
class Layout:
    """The sampler's starting point: what each position holds and whether it may change."""

    ids: list[int]  # one per position: fixed tokens, editable spans' tokens, fill_id in blanks
    editable: list[bool]  # one per position; True where the sampler may write
    spans: list[tuple[int, int]]  # token span [a, b) of each segment, in order
    segments: list[Segment]

    @property
    def seeded(self) -> list[bool]:
        """One flag per position; True inside editable text spans ([[text]]), whose tokens an edit
        starts from; blanks and the tail start from the prior."""
        flags = [False] * len(self.ids)
        for seg, (a, b) in zip(self.segments, self.spans, strict=True):
            if seg.editable and seg.blank_tokens is None:
                flags[a:b] = [True] * (b - a)
        return flags


def _tokens(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def build_layout(
    segments: list[Segment], tokenizer: PreTrainedTokenizerBase, seq_len: int, fill_id: int
) -> Layout:
    """Lays the regions out end to end on a canvas of at most ``seq_len`` tokens.

    The canvas is exactly the regions, so nothing is written after the template's last one: an
    infill or edit template (``parse_template``) ends where it ends, after its last fixed text or
    with its last gap, and ``seq_len`` only bounds it. A final ``tail`` segment (a prompt's
    continuation, ``prompt_template``) is the one region that grows: to the room the others
    leave on ``seq_len`` (none left: it is dropped). Each region is tokenised on its own so that
    region boundaries fall on token boundaries.
    """
    tail = segments[-1] if segments and segments[-1].tail else None
    ids: list[int] = []
    editable: list[bool] = []
    spans: list[tuple[int, int]] = []
    kept: list[Segment] = []
    for seg in segments[:-1] if tail is not None else segments:
        if seg.blank_tokens is not None:
            if len(ids) + seg.blank_tokens > seq_len:  # before the list: [[10**20]] is no list
                raise ValueError(
                    f"the template's regions take {len(ids) + seg.blank_tokens} tokens or more, "
                    f"longer than the canvas of {seq_len} (seq_len)"
                )
            tokens = [fill_id] * seg.blank_tokens
        else:
            tokens = _tokens(tokenizer, seg.text)
            if not tokens and not seg.editable and not seg.text:
                continue  # empty fixed text (an empty prompt): nothing to hold or write back
            # fixed text that a normalising tokenizer erases (" " for WordPiece) is kept with
            # an empty span, so that assemble still writes it back
        spans.append((len(ids), len(ids) + len(tokens)))
        ids += tokens
        editable += [seg.editable] * len(tokens)
        kept.append(seg)
    if len(ids) > seq_len:
        raise ValueError(
            f"the prompt and fixed regions take {len(ids)} tokens, longer than the canvas of "
            f"{seq_len} (seq_len)"
        )
    if tail is not None and len(ids) < seq_len:
        room = seq_len - len(ids)
        kept.append(replace(tail, blank_tokens=room))
        spans.append((len(ids), seq_len))
        ids += [fill_id] * room
        editable += [True] * room
    return Layout(ids=ids, editable=editable, spans=spans, segments=kept)


@dataclass
class Region:
    """Where one template region ended up in the output (for the JSON that ``cdlm-sample``
    writes next to the text, so edits can be traced back)."""

    kind: str  # "fixed" | "generated"
    input: tuple[int, int]  # char span in the template
    output: tuple[int, int]  # char span in the output text
    tokens: tuple[int, int]  # token span on the canvas
    text: str  # the region's output text

    def as_dict(self) -> dict:
        return {
            "kind": self.kind,
            "input": list(self.input),
            "output": list(self.output),
            "tokens": list(self.tokens),
            "text": self.text,
        }


def _decode(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> str:
    """EOS is written as a line break (packed training data puts EOS between paragraphs); other
    special tokens are dropped; no whitespace is stripped or cleaned up."""
    eos = tokenizer.eos_token_id
    pieces, start = [], 0
    for i, token in enumerate([*ids, None]):
        if token is None or (eos is not None and token == eos):
            pieces.append(
                tokenizer.decode(
                    ids[start:i], skip_special_tokens=True, clean_up_tokenization_spaces=False
                )
            )
            start = i + 1
    return "\n".join(pieces)


def assemble(
    canvas: Layout, ids: list[int], tokenizer: PreTrainedTokenizerBase
) -> tuple[str, list[Region]]:
    """The output text and its region map, from the sampled ``ids`` (one per canvas position).

    Raises ``ValueError`` if the ids differ from the canvas at a fixed region: the sampler broke
    the constraint, and writing the template text back would hide that.
    """
    ids = [int(t) for t in ids]
    if len(ids) != len(canvas.ids):
        raise ValueError(f"got {len(ids)} sampled ids for a canvas of {len(canvas.ids)} tokens")
    text, regions = "", []
    for seg, (a, b) in zip(canvas.segments, canvas.spans, strict=True):
        if seg.editable:
            piece = _decode(tokenizer, ids[a:b])
        else:
            if ids[a:b] != canvas.ids[a:b]:
                pos = next(k for k in range(a, b) if ids[k] != canvas.ids[k])
                raise ValueError(
                    f"the sampled ids changed the fixed region at characters {seg.start}-"
                    f"{seg.end} of the template (token {pos}: {ids[pos]} instead of "
                    f"{canvas.ids[pos]})"
                )
            piece = seg.text
        kind = "generated" if seg.editable else "fixed"
        out = (len(text), len(text) + len(piece))
        regions.append(Region(kind, (seg.start, seg.end), out, (a, b), piece))
        text += piece
    return text, regions
