"""The peak memory of one stretch of work (a row of the speed table), not of the process's life.

The process's lifetime maximum (``getrusage``'s max RSS, CUDA's peak without a reset) only grows,
so every row measured after a big one would read big. On CUDA the allocator's peak counter is
reset when the stretch starts; on CPU a background thread samples the resident set every few
milliseconds, since the kernel keeps no resettable peak of its own. The resident set misses
what the allocator serves from pages an earlier stretch freed but kept resident, so a CPU row can
read below what it used.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

import torch

MB = 2**20


@dataclass(frozen=True)
class MemoryPeak:
    """kind: ``"rss"`` (CPU: the process's resident set) or ``"cuda"`` (the allocator's bytes
    in tensors); peak_mb: the stretch's own peak; above_start_mb: that peak less what was in use
    when the stretch started (what the stretch itself added)."""

    kind: str
    peak_mb: float
    above_start_mb: float


def rss_reader() -> Callable[[], int]:
    """A function returning the process's resident set in bytes: psutil's where installed, else
    Linux's /proc/self/statm (its second field: resident pages)."""
    try:
        import psutil
    except ImportError:
        page = os.sysconf("SC_PAGE_SIZE")

        def statm() -> int:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * page

        return statm
    process = psutil.Process()
    return lambda: process.memory_info().rss


class PeakMemory:
    """``with PeakMemory(device) as peak: ...``, then ``peak.result`` (a ``MemoryPeak``).

    On CPU, a peak shorter than ``interval`` seconds between two samples can be missed; one
    sample is taken on entry and one on exit as well."""

    def __init__(self, device: torch.device, interval: float = 0.002) -> None:
        self.device, self.interval = device, interval
        self.cuda = device.type == "cuda"
        self.result: MemoryPeak | None = None

    def __enter__(self) -> PeakMemory:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start = torch.cuda.memory_allocated(self.device)
            return self
        self.read = rss_reader()
        self.start = self.peak = self.read()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self) -> None:
        while not self.stop.wait(self.interval):
            self.peak = max(self.peak, self.read())

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
        else:
            self.stop.set()
            self.thread.join()
            peak = max(self.peak, self.read())
        self.result = MemoryPeak(
            kind="cuda" if self.cuda else "rss",
            peak_mb=peak / MB,
            above_start_mb=(peak - self.start) / MB,
        )
