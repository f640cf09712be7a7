"""``task=constrain``: completions of held-out passages that must meet a checkable constraint.

Every process meets a constraint the same way, through a template (fixed tokens and blanks), so
what is compared is what the model writes around what is fixed. Each kind builds its case from a
passage, or skips a passage that offers none:
- ``contain``: two words of the passage's second half kept at their places, the rest after the
  first third blank. Met by construction (the words are placed); its figure is the gen-PPL.
- ``end_with``: the blank runs up to a fixed sentence-final word (``... W.``); accepted when the
  fill is one sentence running into it (no sentence end inside: a fill that closes its sentence
  early leaves ``W.`` a fragment).
- ``sentences``: a blank of whole sentences after the prompt; accepted with as many sentence
  ends as the original, the last one at the blank's end.
- ``name_twice``: both places of a name the passage uses twice blanked: accepted when both are
  filled with the same capitalised word (joint consistency, decided at both places).
- ``code_line`` (code): one statement line blanked: accepted when it parses (``ast.parse``).
- ``code_name`` (code): both places of an identifier blanked: accepted when both hold the same
  identifier.
A row reports ``acceptance``, ``matches_original`` (the fill is the original's tokens) and, with
a scorer, the perplexity of the accepted passages (``accepted_ppl``).
"""

from __future__ import annotations

import ast
import keyword
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass

from cdlm.evaluation.quality import Scorer, generative_perplexity
from cdlm.model_file import Model
from cdlm.sampling import Plan
from cdlm.sampling.inputs import fill_id
from cdlm.tasks.passages import Passage
from cdlm.tasks.runs import canvas, run_cases

TEXT_KINDS = ("contain", "end_with", "sentences", "name_twice")
CODE_KINDS = ("code_line", "code_name")
KINDS = TEXT_KINDS + CODE_KINDS
END = re.compile(r"[.!?][\"')]*$")
TITLES = {"Mr", "Mrs", "Dr", "St", "Col", "Capt"}  # a full stop that ends no sentence
MIN_BLANK = 4  # words


@dataclass(frozen=True)
class Case:
    passage: Passage
    blank: frozenset[int]  # the blanked words' indices
    kind: str
    end: int  # the words of the template: it ends where they do
    count: int = 0  # sentences: the original's sentence ends
    head: int = 0  # name_twice: only each blanked word's first ``head`` tokens (the name)

    def gap(self, w: int) -> tuple[int, int]:
        a, b = self.passage.spans[w]
        return (a, min(b, a + self.head)) if self.head else (a, b)

    def editable(self) -> list[bool]:
        marks = [False] * self.length()
        for w in self.blank:
            a, b = self.gap(w)
            marks[a:b] = [True] * (b - a)
        return marks

    def length(self) -> int:
        return self.passage.spans[self.end - 1][1]


def _alpha(word: str) -> bool:
    return word.strip().isalpha()


def _ends_sentence(word: str) -> bool:
    w = word.strip()
    return bool(END.search(w)) and w.rstrip("\"')").rstrip(".!?") not in TITLES


def sentence_ends(text: str) -> int:
    return sum(map(_ends_sentence, text.split()))


def _contain(p: Passage) -> Case | None:
    n, start = len(p.words), len(p.words) // 3
    picks = [i for i in range(n // 2, n) if _alpha(p.words[i]) and len(p.words[i].strip()) >= 4]
    if len(picks) < 2 or n - start < MIN_BLANK + 2:
        return None
    keep = {picks[0], picks[-1]}
    return Case(p, frozenset(set(range(start, n)) - keep), "contain", n)


def _end_with(p: Passage) -> Case | None:
    start = len(p.words) // 3
    for k in range(start + MIN_BLANK, len(p.words)):
        w = p.words[k].strip()
        if _ends_sentence(w) and w[:-1].isalpha() and w.endswith("."):
            if not any(_ends_sentence(p.words[j]) for j in range(start, k)):
                return Case(p, frozenset(range(start, k)), "end_with", k + 1)
    return None


def _sentences(p: Passage) -> Case | None:
    ends = [k for k, w in enumerate(p.words) if _ends_sentence(w)]
    if len(ends) < 3:
        return None
    return Case(p, frozenset(range(ends[0] + 1, ends[2] + 1)), "sentences", ends[2] + 1, 2)


def _twice(p: Passage, key: Callable[[int], str | None]) -> tuple[int, int, int] | None:
    """The first two words (no line break in them) with the same ``key`` whose tokens share a
    first run: (first place, second place, the run's length)."""
    seen: dict[str, int] = {}
    for i in range(1, len(p.words)):
        k = None if "\n" in p.words[i] else key(i)
        if k is None:
            continue
        if k in seen:
            first, second = p.ids[slice(*p.spans[seen[k]])], p.ids[slice(*p.spans[i])]
            run = next(
                (n for n, (x, y) in enumerate(zip(first, second, strict=False)) if x != y), None
            )
            run = min(len(first), len(second)) if run is None else run
            if run:
                return seen[k], i, run
        seen.setdefault(k, i)
    return None


def _name(word: str) -> bool:
    core = word.strip().rstrip(",;:.!?")
    return core.isalpha() and core[0].isupper() and len(core) >= 3


def _name_twice(p: Passage) -> Case | None:
    """A name used twice inside sentences; only its own tokens are blanked, the punctuation
    after either place stays."""

    def name(i: int) -> str | None:  # capitalised inside a sentence: a name
        w = p.words[i]
        ok = _name(w) and not _ends_sentence(p.words[i - 1])
        return w.strip().rstrip(",;:.!?") if ok else None

    found = _twice(p, name)
    if found is None:
        return None
    a, b, run = found
    return Case(p, frozenset({a, b}), "name_twice", b + 1, head=run)


def _code_name(p: Passage) -> Case | None:
    def ident(i: int) -> str | None:
        w = p.words[i].strip()
        return w if w.isidentifier() and not keyword.iskeyword(w) and len(w) > 1 else None

    found = _twice(p, ident)
    if found is None or found[2] != len(range(*p.spans[found[0]])):
        return None  # the same identifier, token for token
    return Case(p, frozenset(found[:2]), "code_name", found[1] + 1)


def _lines(p: Passage) -> list[list[int]]:
    """The passage's lines as lists of word indices (a word opening a line holds its break)."""
    lines: list[list[int]] = [[]]
    for i, w in enumerate(p.words):
        if "\n" in w:
            lines.append([])
        lines[-1].append(i)
    return lines


def _code_line(p: Passage) -> Case | None:
    """A statement line that parses alone, its first word (the line break, the indentation and
    the first token) kept and the rest blank."""
    for line in _lines(p)[1:-1]:  # the first and last may be cut
        text = "".join(p.words[i] for i in line).split("\n")[-1]
        if len(line) >= 4 and _parses(text) and not _only_text(text):
            return Case(p, frozenset(line[1:]), "code_line", line[-1] + 1)
    return None


def _only_text(line: str) -> bool:
    """A docstring or string line: it parses, but asks nothing of the syntax."""
    body = ast.parse(textwrap.dedent(line)).body
    return not body or all(
        isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body
    )


def _parses(line: str) -> bool:
    try:
        ast.parse(textwrap.dedent(line))
    except SyntaxError:
        return False
    return True


BUILD = {
    "contain": _contain,
    "end_with": _end_with,
    "sentences": _sentences,
    "name_twice": _name_twice,
    "code_line": _code_line,
    "code_name": _code_name,
}


def _decode(tok, ids: list[int]) -> str:
    """Line breaks as EOS (as every corpus here has them), decoded as line breaks."""
    lines, current = [], []
    for t in ids:
        if t == tok.eos_token_id:
            lines.append(current)
            current = []
        else:
            current.append(t)
    return "\n".join(tok.decode(line) for line in [*lines, current])


def fills(case: Case, ids: list[int], tok) -> list[str]:
    """Each blanked word's text in ``ids``."""
    return [_decode(tok, ids[slice(*case.gap(w))]) for w in sorted(case.blank)]


def accepted(case: Case, ids: list[int], tok) -> bool:
    """The kind's acceptance check on the output ``ids``."""
    words = fills(case, ids, tok)
    text = "".join(words)
    if case.kind == "contain":
        kept = set(range(min(case.blank), case.end)) - case.blank
        return all(_same(case, ids, w) for w in kept)
    if case.kind == "end_with":
        return not any(map(_ends_sentence, text.split()))
    if case.kind == "sentences":
        return sentence_ends(text) == case.count and _ends_sentence(
            text.split()[-1] if text.split() else ""
        )
    if case.kind == "code_line":
        first = case.passage.spans[min(case.blank) - 1][0]
        return _parses(_decode(tok, ids[first : case.length()]).split("\n")[-1])
    a, b = (w.strip() for w in words)
    if case.kind == "code_name":
        return a == b and a.isidentifier() and not keyword.iskeyword(a)
    return a == b and _name(a)


def _same(case: Case, ids: list[int], w: int) -> bool:
    span = slice(*case.gap(w))
    return ids[span] == case.passage.ids[span]


def make_cases(passages: list[Passage], kind: str, tok) -> list[Case]:
    """The kind's case of each passage that has one its own text passes (so an oracle that
    writes the original is always accepted)."""
    if kind not in BUILD:
        raise ValueError(f"unknown constraint kind {kind!r}; choose from {KINDS}")
    cases = [c for c in map(BUILD[kind], passages) if c is not None]
    return [c for c in cases if accepted(c, c.passage.ids, tok)]


def run(
    model: Model,
    sampler: Callable,
    passages: list[Passage],
    *,
    steps: int,
    seed: int,
    scorer: Scorer | None,
    kinds: list[str] = TEXT_KINDS,
) -> list[dict]:
    """One row per constraint kind with at least one case among the passages."""
    tok = model.tokenizer
    fill, rows = fill_id(tok), []
    for kind in kinds:
        cases = make_cases(passages, kind, tok)
        if not cases:
            continue
        plans = []
        for i, c in enumerate(cases):
            n = c.length()
            layout = canvas(c.passage.ids[:n], c.editable(), fill)
            plans.append(Plan(1, n, steps, seed + i, layout=layout, cut_at_eos=False))
        runs = run_cases(model, sampler, plans)
        outputs = [g.samples[0].token_ids for g in runs.generations]
        ok = [accepted(c, ids, tok) for c, ids in zip(cases, outputs, strict=True)]
        same = [
            all(_same(c, ids, w) for w in c.blank) for c, ids in zip(cases, outputs, strict=True)
        ]
        row = {
            "kind": kind,
            "cases": len(cases),
            "acceptance": sum(ok) / len(cases),
            "matches_original": sum(same) / len(cases),
        }
        texts = [
            tok.decode(ids, skip_special_tokens=True)
            for ids, good in zip(outputs, ok, strict=True)
            if good
        ]
        if scorer is not None and texts:
            row["accepted_ppl"] = generative_perplexity(texts, scorer).ppl
        rows.append(row | runs.work())
    if not rows:
        raise ValueError(
            f"no passage offers a case of {list(kinds)}: the passages are too short (at most "
            f"{max(len(p.ids) for p in passages)} tokens) or hold no such words"
        )
    return rows
