"""The constraints of ``task=constrain`` (``cdlm.tasks.constrain``): for each kind, how a case is
built from a held-out passage (which words are blanked, where the template ends) and its exact
acceptance check on the model's output."""

from __future__ import annotations

import ast
import keyword
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass

from cdlm.tasks.passages import Passage, decode_lines

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
    rule: str  # the constraint kind
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


def _build_contain(p: Passage) -> Case | None:
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
    "contain": _build_contain,
    "end_with": _end_with,
    "sentences": _sentences,
    "name_twice": _name_twice,
    "code_line": _code_line,
    "code_name": _code_name,
}


def fills(case: Case, ids: list[int], tok) -> list[str]:
    """Each blanked word's text in ``ids``."""
    return [decode_lines(tok, ids[slice(*case.gap(w))]) for w in sorted(case.blank)]


def _contain(case: Case, ids: list[int], tok) -> bool:
    kept = set(range(min(case.blank), case.end)) - case.blank
    return all(same(case, ids, w) for w in kept)


def _one_sentence(case: Case, ids: list[int], tok) -> bool:
    return not any(map(_ends_sentence, "".join(fills(case, ids, tok)).split()))


def _sentence_count(case: Case, ids: list[int], tok) -> bool:
    words = "".join(fills(case, ids, tok)).split()
    return (
        bool(words) and sentence_ends(" ".join(words)) == case.count and _ends_sentence(words[-1])
    )


def _line_parses(case: Case, ids: list[int], tok) -> bool:
    first = case.passage.spans[min(case.blank) - 1][0]
    return _parses(decode_lines(tok, ids[first : case.length()]).split("\n")[-1])


def _same_name(case: Case, ids: list[int], tok) -> bool:
    a, b = (w.strip() for w in fills(case, ids, tok))
    return a == b and _name(a)


def _same_identifier(case: Case, ids: list[int], tok) -> bool:
    a, b = (w.strip() for w in fills(case, ids, tok))
    return a == b and a.isidentifier() and not keyword.iskeyword(a)


CHECK = {
    "contain": _contain,
    "end_with": _one_sentence,
    "sentences": _sentence_count,
    "name_twice": _same_name,
    "code_line": _line_parses,
    "code_name": _same_identifier,
}


def accepted(case: Case, ids: list[int], tok) -> bool:
    """The case's acceptance check on the output ``ids``."""
    return CHECK[case.rule](case, ids, tok)


def same(case: Case, ids: list[int], w: int) -> bool:
    span = slice(*case.gap(w))
    return ids[span] == case.passage.ids[span]
