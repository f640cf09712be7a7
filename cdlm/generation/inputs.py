"""What a user gives to sample from, turned into a ``Layout`` and a label index, with errors that
name the problem."""

from __future__ import annotations

import json
from dataclasses import dataclass

from cdlm.model_file import Model
from cdlm.regions import Layout, build_layout, parse_template, prompt_template


def label_index(model: Model, label: str | None) -> int | None:
    """The class index of ``label``; a clear error for unknown labels or unlabelled models."""
    if label is None:
        return None
    if getattr(model.network, "num_classes", 0) == 0:
        raise ValueError(f"label={label!r} given, but this model was trained without labels")
    names = model.config.get("labels", [])
    if str(label) not in names:
        raise ValueError(f"unknown label {label!r}; this model knows: {', '.join(names)}")
    return names.index(str(label))


def fill_id(tokenizer) -> int:
    """What a blank starts from: [MASK], or EOS for a tokenizer without one."""
    mask = tokenizer.mask_token_id
    return mask if mask is not None else tokenizer.eos_token_id


def read_layout(
    model: Model,
    seq_len: int,
    *,
    prompt: str | None = None,
    infill: str | None = None,
    edit: str | None = None,
    max_new_tokens: int | None = None,
) -> Layout | None:
    """The canvas of fixed and editable regions from a prompt, an infill template or an edit
    template's text (at most one); None without any of them. A template's canvas is its regions
    and ends where it ends (``cdlm.regions.build_layout``), at most ``seq_len`` positions; a
    prompt's continues to ``seq_len`` positions, or with ``max_new_tokens`` to that many after
    the prompt."""
    tok = model.tokenizer
    fill = fill_id(tok)
    if max_new_tokens is not None and prompt is None:
        raise ValueError("max_new_tokens counts the tokens after a prompt; give one")
    if prompt is not None:
        segments = prompt_template(prompt)
    elif infill is not None or edit is not None:
        segments = parse_template(infill if infill is not None else edit)
    else:
        return None
    layout = build_layout(segments, tok, seq_len, fill)
    if max_new_tokens is None:
        return layout
    given = sum(not e for e in layout.editable)
    total, most = given + max_new_tokens, model.config["seq_len"]
    if total > most:
        raise ValueError(
            f"the prompt ({given} tokens) and max_new_tokens={max_new_tokens} make {total} "
            f"positions, more than the model's {most} (its training length)"
        )
    return build_layout(segments, tok, total, fill)


@dataclass(frozen=True)
class Row:
    """One row of a batch of different prompts (``cdlm.generation.rows``): a ``prompt`` to
    continue (up to ``max_new_tokens`` tokens after it, else to the canvas's ``seq_len``) or an
    ``infill`` template, exactly one of the two."""

    prompt: str | None = None
    infill: str | None = None
    max_new_tokens: int | None = None


_ROW_KEYS = {"prompt", "infill", "max_new_tokens"}


def read_rows(text: str) -> list[Row]:
    """The rows of a ``prompts=FILE``: one JSON object per line (row N is line N) with
    ``prompt`` or ``infill`` and optionally ``max_new_tokens``; a one-line error naming the
    line of the first bad one."""
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"line {number}: not JSON ({e.msg})") from None
        if not isinstance(item, dict):
            raise ValueError(f"line {number}: expected a JSON object, got {type(item).__name__}")
        unknown = sorted(set(item) - _ROW_KEYS)
        if unknown:
            raise ValueError(f"line {number}: unknown keys {unknown}; valid: {sorted(_ROW_KEYS)}")
        given = [k for k in ("prompt", "infill") if item.get(k) is not None]
        if len(given) != 1:
            raise ValueError(f"line {number}: give exactly one of prompt or infill (got {given})")
        if not isinstance(item[given[0]], str):
            raise ValueError(f"line {number}: {given[0]} must be a string")
        most = item.get("max_new_tokens")
        if most is not None and (isinstance(most, bool) or not isinstance(most, int) or most < 1):
            raise ValueError(f"line {number}: max_new_tokens must be an integer >= 1, got {most}")
        rows.append(Row(item.get("prompt"), item.get("infill"), most))
    if not rows:
        raise ValueError("the prompts file has no rows")
    return rows


def row_layouts(model: Model, seq_len: int, rows: list[Row], what: str = "row") -> list[Layout]:
    """Each row's canvas (``read_layout``); an error names the row as ``what`` N (``line`` for
    a prompts file)."""
    layouts = []
    for number, row in enumerate(rows, 1):
        try:
            layouts.append(
                read_layout(
                    model,
                    seq_len,
                    prompt=row.prompt,
                    infill=row.infill,
                    max_new_tokens=row.max_new_tokens,
                )
            )
        except ValueError as e:
            raise ValueError(f"{what} {number}: {e}") from None
    return layouts
