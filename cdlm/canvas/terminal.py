"""The canvas redrawn in the terminal at every step (plain ANSI; no dependency).

Colours: undecided positions (``[MASK]``, positions still to come) are dim dots; positions
decided or revised at this step are bold yellow; fixed regions (a prompt, infill context) are
cyan; a token whose probability is below one half is dimmed (a gaussian position's argmax
under the current prediction, a committed token at its commit). The
header gives the step, NFE, the interval t -> s and how many positions are decided.
"""

from __future__ import annotations

import sys
from typing import TextIO

from torch import Tensor

from cdlm.canvas.record import Frame, Trajectory

RESET, DIM, BOLD_YELLOW, CYAN = "\x1b[0m", "\x1b[2m", "\x1b[1;33m", "\x1b[36m"
HOME_AND_CLEAR = "\x1b[H\x1b[2J"
UNDECIDED = "·"
LINE_BREAK = "↵\n"


class Pieces:
    """Each token id's own text (cached): what a position shows on its own."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.cache = tokenizer, {}
        self.eos = tokenizer.eos_token_id

    def __call__(self, token: int) -> str:
        if token not in self.cache:
            text = LINE_BREAK if token == self.eos else self.tokenizer.decode([token])
            self.cache[token] = text or "∅"
        return self.cache[token]


def render(
    frame: Frame,
    row: int,
    pieces: Pieces,
    fixed: Tensor | None = None,
    steps: int | None = None,
    colour: bool = True,
) -> str:
    """One frame of one sample as text (ANSI-coloured when ``colour``)."""

    def paint(code: str, text: str) -> str:
        return f"{code}{text}{RESET}" if colour else text

    tokens, decided = frame.tokens[row].tolist(), frame.decided[row].tolist()
    changed, confidence = frame.changed[row].tolist(), frame.confidence[row].tolist()
    held = fixed.tolist() if fixed is not None else [False] * len(tokens)
    out = []
    for token, done, new, p, is_fixed in zip(
        tokens, decided, changed, confidence, held, strict=True
    ):
        if not done:
            out.append(paint(DIM, UNDECIDED))
        elif is_fixed:
            out.append(paint(CYAN, pieces(token)))
        elif new:
            out.append(paint(BOLD_YELLOW, pieces(token)))
        elif p < 0.5:
            out.append(paint(DIM, pieces(token)))  # a token the model doubts
        else:
            out.append(pieces(token))
    total = f"/{steps}" if steps else ""
    n_decided = sum(decided)
    header = (
        f"step {frame.step + 1}{total} · NFE {frame.nfe} · t {frame.t:.3f} → {frame.s:.3f} · "
        f"{n_decided}/{len(tokens)} decided, {sum(changed)} changed"
    )
    return f"{paint(BOLD_YELLOW, header) if colour else header}\n{''.join(out)}\n"


class LiveCanvas:
    """A ``Recorder`` ``on_frame`` hook that redraws sample ``row`` of each batch in place (on a
    terminal; elsewhere each frame is appended, uncoloured)."""

    def __init__(
        self,
        tokenizer,
        row: int = 0,
        fixed: Tensor | None = None,
        steps: int | None = None,
        stream: TextIO | None = None,
    ) -> None:
        self.pieces, self.row, self.fixed, self.steps = Pieces(tokenizer), row, fixed, steps
        self.stream = stream or sys.stderr
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())

    def __call__(self, frame: Frame, trajectory: Trajectory) -> None:
        if self.row >= frame.tokens.shape[0]:
            return
        text = render(frame, self.row, self.pieces, self.fixed, self.steps, colour=self.live)
        self.stream.write((HOME_AND_CLEAR if self.live else "") + text)
        self.stream.flush()
