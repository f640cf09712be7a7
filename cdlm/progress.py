"""Progress of long work (likelihood batches, timed runs) on stderr, where the user is.

On a terminal a tqdm bar, as ``cdlm-sample`` draws. Elsewhere (a log file, a SLURM job's
output) a bar's carriage returns are noise, and nothing at all reads as a hang; so there it is
one plain, flushed line every ``every_s`` seconds and ``every_k`` items, whichever is rarer,
plus a final line: ``cdlm-eval: ode_nll batch 3/8, 1:30, about 2:30 left``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import Any, TextIO, TypeVar

from tqdm import tqdm

T = TypeVar("T")


def duration(seconds: float) -> str:
    """``m:ss``, or ``h:mm:ss`` from an hour on."""
    minutes, s = divmod(int(seconds), 60)
    hours, m = divmod(minutes, 60)
    return f"{hours}:{m:02d}:{s:02d}" if hours else f"{m}:{s:02d}"


class Progress:
    """Counts items done against ``total`` (None: unknown) under the label ``desc``.

    ``tty``: None asks the stream (``isatty``); True or False forces the bar or the lines.
    ``enabled`` false prints nothing. ``clock`` gives seconds (injected by tests)."""

    def __init__(
        self,
        total: int | None,
        desc: str,
        *,
        enabled: bool = True,
        tty: bool | None = None,
        every_s: float = 30.0,
        every_k: int = 1,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total, self.desc, self.enabled = total, desc, enabled
        self.every_s, self.every_k, self.clock = every_s, every_k, clock
        self.stream = sys.stderr if stream is None else stream  # read now: tests swap stderr
        self.n = self.last_n = 0
        self.start = self.last_t = clock()
        on_tty = self.stream.isatty() if tty is None else tty
        self.bar = (
            tqdm(total=total, desc=desc, file=self.stream, leave=False)
            if enabled and on_tty
            else None
        )

    def update(self, n: int = 1) -> None:
        """``n`` more items done; a line when both ``every_s`` and ``every_k`` have passed."""
        self.n += n
        if self.bar is not None:
            self.bar.update(n)
            return
        now = self.clock()
        due = now - self.last_t >= self.every_s and self.n - self.last_n >= self.every_k
        if self.enabled and due and self.n != self.total:  # the last item: close's line
            self.last_t, self.last_n = now, self.n
            self._line(f"{self._where()}, {duration(now - self.start)}{self._left(now)}")

    def close(self) -> None:
        """Ends the bar, or prints the final line."""
        if self.bar is not None:
            self.bar.close()
        elif self.enabled:
            self._line(f"{self._where()}, done in {duration(self.clock() - self.start)}")

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, error: type[BaseException] | None, *_: object) -> None:
        if error is None:
            self.close()
        elif self.bar is not None:  # a failure: its traceback speaks, without a "done" line
            self.bar.close()

    def _where(self) -> str:
        return f"{self.n}" if self.total is None else f"{self.n}/{self.total}"

    def _left(self, now: float) -> str:
        if self.total is None or self.n == 0:
            return ""
        return f", about {duration((now - self.start) / self.n * (self.total - self.n))} left"

    def _line(self, text: str) -> None:
        print(f"{self.desc} {text}", file=self.stream, flush=True)


def progress(
    items: Iterable[T], desc: str, *, total: int | None = None, **options: Any
) -> Iterator[T]:
    """Yields ``items`` and reports each one done (see ``Progress`` for ``options``); ``total``
    defaults to ``len(items)`` where they have one."""
    if total is None and isinstance(items, Sized):
        total = len(items)
    with Progress(total, desc, **options) as bar:
        for item in items:
            yield item
            bar.update()
