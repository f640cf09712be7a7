"""Templates with fixed and editable regions: parsing, the canvas, and assembling the output."""

from __future__ import annotations

import json

import pytest

from cdlm.data.corpus import load_documents
from cdlm.data.tokenizer import corpus_bpe
from cdlm.regions import (
    Segment,
    assemble,
    build_layout,
    parse_template,
    prompt_template,
)

FILL = 0  # any id will do as the blank filler; tests check it is where blanks are


@pytest.fixture(scope="module")
def tok(tiny_corpus):
    """The project's byte-level corpus BPE (cached under the session's $CDLM_CACHE)."""
    return corpus_bpe(load_documents(str(tiny_corpus)), vocab_size=300)


def ids_of(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


# --- parsing -------------------------------------------------------------------------------


def test_parse_mix_of_fixed_blank_and_editable_with_offsets():
    t = "Dear [[3]], I [[was glad]] to hear[[12]]"
    segs = parse_template(t)
    assert segs == [
        Segment("Dear ", False, None, 0, 5),
        Segment("", True, 3, 5, 10),
        Segment(", I ", False, None, 10, 14),
        Segment("was glad", True, None, 14, 26),
        Segment(" to hear", False, None, 26, 34),
        Segment("", True, 12, 34, 40),
    ]
    for s in segs:  # every span points at what the user wrote
        if not s.editable:
            assert t[s.start : s.end] == s.text
        elif s.blank_tokens is None:
            assert t[s.start : s.end] == f"[[{s.text}]]"
        else:
            assert t[s.start : s.end] == f"[[{s.blank_tokens}]]"


def test_parse_plain_text_single_brackets_and_edge_positions():
    assert parse_template("") == []
    assert parse_template("a [b] c] [") == [Segment("a [b] c] [", False, None, 0, 10)]
    assert parse_template("[[x]]") == [Segment("x", True, None, 0, 5)]
    # numbers that are not a bare positive integer are editable text, not blanks
    assert parse_template("[[ 5 ]][[-2]]") == [
        Segment(" 5 ", True, None, 0, 7),
        Segment("-2", True, None, 7, 13),
    ]


@pytest.mark.parametrize(
    ("template", "words", "offset"),
    [
        ("abc [[def", "never closed", 4),
        ("abc ]] def", "stray ']]'", 4),
        ("a [[b]] c]] d", "stray ']]'", 9),
        ("a [[b [[c]] d]]", "nested", 6),
        ("a [[]] b", "empty", 2),
        ("a [[0]] b", "zero tokens", 2),
        ("a [[000]] b", "zero tokens", 2),
    ],
)
def test_parse_errors_name_the_problem_and_offset(template, words, offset):
    with pytest.raises(ValueError, match="character") as err:
        parse_template(template)
    message = str(err.value)
    assert words in message and f"character {offset}" in message and "\n" not in message


def test_prompt_template_is_a_literal_fixed_prefix_and_a_tail():
    assert prompt_template("Once [[upon]]") == [
        Segment("Once [[upon]]", False, None, 0, 13),
        Segment("", True, None, 13, 13, tail=True),
    ]


# --- canvas --------------------------------------------------------------------------------


def test_canvas_lengths_flags_and_spans(tok):
    t = "She said [[4]] and [[smiled warmly]] at him."
    canvas = build_layout(parse_template(t), tok, seq_len=64, fill_id=FILL)
    n = len(canvas.ids)
    assert len(canvas.editable) == n < 64  # the template's regions, not the whole seq_len
    assert len(canvas.spans) == len(canvas.segments) == len(parse_template(t))
    # spans tile the canvas in order
    assert canvas.spans[0][0] == 0 and canvas.spans[-1][1] == n
    assert all(b == c for (_, b), (c, _) in zip(canvas.spans, canvas.spans[1:], strict=False))
    for seg, (a, b) in zip(canvas.segments, canvas.spans, strict=True):
        assert canvas.editable[a:b] == [seg.editable] * (b - a)
        if seg.blank_tokens is not None:
            assert b - a == seg.blank_tokens and canvas.ids[a:b] == [FILL] * (b - a)
        else:  # fixed text and editable spans start from their own tokens
            assert canvas.ids[a:b] == ids_of(tok, seg.text)
    assert canvas.segments[1].blank_tokens == 4


def test_template_canvas_ends_where_the_template_ends(tok):
    """No editable tail after an infill/edit template, however long seq_len: it ends at its
    last fixed text, or with its last gap."""
    t = "It is a truth [[universally]] acknowledged"
    n = sum(len(ids_of(tok, s)) for s in ("It is a truth ", "universally", " acknowledged"))
    for seq_len in (n, n + 7):
        canvas = build_layout(parse_template(t), tok, seq_len=seq_len, fill_id=FILL)
        assert canvas.segments == parse_template(t) and len(canvas.ids) == n
        assert canvas.spans[-1] == (n - len(ids_of(tok, " acknowledged")), n)
        assert not canvas.editable[-1]
    gap = "It is a truth [[5]]"
    canvas = build_layout(parse_template(gap), tok, seq_len=n + 7, fill_id=FILL)
    k = len(ids_of(tok, "It is a truth "))
    assert canvas.segments == parse_template(gap) and canvas.spans == [(0, k), (k, k + 5)]
    assert canvas.ids[k:] == [FILL] * 5 and canvas.editable == [False] * k + [True] * 5


def test_prompt_canvas_and_empty_prompt(tok):
    canvas = build_layout(prompt_template("Emma Woodhouse"), tok, seq_len=20, fill_id=FILL)
    k = len(ids_of(tok, "Emma Woodhouse"))
    assert canvas.editable == [False] * k + [True] * (20 - k)
    assert canvas.segments[1] == Segment("", True, 20 - k, 14, 14, tail=True)
    assert canvas.spans == [(0, k), (k, 20)] and canvas.ids[k:] == [FILL] * (20 - k)
    # a prompt that fills the canvas leaves no tail
    full = build_layout(prompt_template("Emma Woodhouse"), tok, seq_len=k, fill_id=FILL)
    assert full.editable == [False] * k and len(full.segments) == 1
    # an empty prompt tokenises to nothing: it is dropped, the whole canvas is the tail
    empty = build_layout(prompt_template(""), tok, seq_len=5, fill_id=FILL)
    assert empty.segments == [Segment("", True, 5, 0, 0, tail=True)] and empty.spans == [(0, 5)]


def test_template_longer_than_canvas_names_both_numbers(tok):
    t = "Some fixed words and [[30]]"
    n = len(ids_of(tok, "Some fixed words and ")) + 30
    with pytest.raises(ValueError, match=rf"take {n} tokens.*canvas of 16 \(seq_len\)"):
        build_layout(parse_template(t), tok, seq_len=16, fill_id=FILL)


def test_a_blank_too_large_for_any_list_is_refused_as_longer_than_the_canvas(tok):
    """Found by tests/test_fuzz.py: ``[[99999999999999999999]]`` raised OverflowError (a
    traceback) while its blank was made, before the canvas check."""
    with pytest.raises(ValueError, match=r"take 99999999999999999999 tokens or more.*canvas of 16"):
        build_layout(parse_template("[[99999999999999999999]]"), tok, seq_len=16, fill_id=FILL)


# --- assemble ------------------------------------------------------------------------------


def test_round_trip_keeps_fixed_text_byte_identical(tok):
    t = "  naïve — café [[3]]\tdéjà vu, “quoted” [[über]]  \n"
    canvas = build_layout(parse_template(t), tok, seq_len=80, fill_id=tok.eos_token_id)
    text, regions = assemble(canvas, canvas.ids, tok)
    fixed = [r for r in regions if r.kind == "fixed"]
    assert [r.text for r in fixed] == ["  naïve — café ", "\tdéjà vu, “quoted” ", "  \n"]
    for r in fixed:
        assert r.text.encode() == t[r.input[0] : r.input[1]].encode()
    # byte-level BPE round-trips: fixed tokens decode to the fixed text, and the editable span
    # decodes to its starting text
    for seg, (a, b) in zip(canvas.segments, canvas.spans, strict=True):
        if not seg.editable:
            assert tok.decode(canvas.ids[a:b], clean_up_tokenization_spaces=False) == seg.text
    at = t.index("[[über]]")
    assert [r.text for r in regions if r.input == (at, at + 8)] == ["über"]
    # blanks hold EOS, written as line breaks; the output ends with the template's end
    assert regions[1].text == "\n\n\n" and regions[-1].kind == "fixed"
    assert text == "".join(r.text for r in regions) and text.endswith("“quoted” über  \n")


def test_output_spans_slice_the_output_text(tok):
    t = "Mr. [[2]] called [[on Tuesday]]."
    canvas = build_layout(parse_template(t), tok, seq_len=30, fill_id=FILL)
    sampled = list(canvas.ids)
    a, b = canvas.spans[1]
    word = ids_of(tok, " Knightley")[: b - a]  # the sampler wrote the blank's 2 tokens
    sampled[a:b] = word
    text, regions = assemble(canvas, sampled, tok)
    assert regions[1].text == tok.decode(word) and text.startswith("Mr. " + regions[1].text)
    pos = 0
    for r, (ta, tb) in zip(regions, canvas.spans, strict=True):
        assert r.output == (pos, pos + len(r.text)) and text[r.output[0] : r.output[1]] == r.text
        assert r.tokens == (ta, tb)
        pos = r.output[1]
    assert pos == len(text)
    assert json.loads(json.dumps([r.as_dict() for r in regions]))[0] == {
        "kind": "fixed",
        "input": [0, 4],
        "output": [0, 4],
        "tokens": list(canvas.spans[0]),
        "text": "Mr. ",
    }


def test_assemble_refuses_ids_that_changed_a_fixed_region(tok):
    t = "Fixed start [[2]] fixed end"
    canvas = build_layout(parse_template(t), tok, seq_len=20, fill_id=FILL)
    a, b = canvas.spans[2]
    broken = list(canvas.ids)
    broken[a] = canvas.ids[a] + 1
    with pytest.raises(ValueError, match=rf"fixed region at characters 17-27.*token {a}"):
        assemble(canvas, broken, tok)
    n = len(canvas.ids)
    with pytest.raises(ValueError, match=f"{n - 1} sampled ids for a canvas of {n}"):
        assemble(canvas, canvas.ids[:-1], tok)


class NoSpaceTokenizer:
    """A tokenizer that normalises whitespace away (as WordPiece does): one id per other char."""

    eos_token_id = None

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text if not c.isspace()]}

    def decode(self, ids, **kwargs):
        return "".join(map(chr, ids))


def test_fixed_text_with_no_tokens_still_comes_back():
    t = "ab[[2]] [[cd]]"  # the fixed " " between the regions tokenises to nothing
    canvas = build_layout(parse_template(t), NoSpaceTokenizer(), seq_len=6, fill_id=ord("x"))
    assert canvas.spans == [(0, 2), (2, 4), (4, 4), (4, 6)]
    text, regions = assemble(canvas, canvas.ids, NoSpaceTokenizer())
    assert text == "abxx cd" and regions[2].text == " " and regions[2].tokens == (4, 4)
