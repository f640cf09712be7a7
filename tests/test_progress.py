"""Progress on stderr: periodic plain lines off a terminal (a log file), a tqdm bar on one,
nothing when turned off. The clock is injected: no test waits."""

import io

import torch
from tqdm import tqdm

from cdlm.likelihood import Elbo
from cdlm.likelihood.evaluate import evaluate
from cdlm.progress import Progress, duration, progress


class FakeClock:
    """Seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_duration_reads_minutes_then_hours():
    assert [duration(s) for s in (0, 42.9, 61, 3600 + 62)] == ["0:00", "0:42", "1:01", "1:01:02"]


def test_a_log_file_gets_a_line_every_interval_that_says_where_the_loop_is_and_a_final_one():
    clock, out = FakeClock(), io.StringIO()
    for _ in progress(range(8), "cdlm-eval: ode_nll batch", stream=out, clock=clock):
        clock.now += 14  # every 14 s: a 30 s interval passes at items 3 and 6 (42 s, 84 s)
    assert lines(out) == [
        "cdlm-eval: ode_nll batch 3/8, 0:42, about 1:10 left",
        "cdlm-eval: ode_nll batch 6/8, 1:24, about 0:28 left",
        "cdlm-eval: ode_nll batch 8/8, done in 1:52",
    ]


def test_the_last_item_gets_only_the_final_line():
    clock, out = FakeClock(), io.StringIO()
    for _ in progress(range(2), "x", stream=out, clock=clock):
        clock.now += 30
    assert lines(out) == ["x 1/2, 0:30, about 0:30 left", "x 2/2, done in 1:00"]


def test_the_rarer_of_the_two_intervals_wins():
    clock, out = FakeClock(), io.StringIO()
    with Progress(None, "run", every_s=5, every_k=4, stream=out, clock=clock) as bar:
        for _ in range(9):
            clock.now += 10  # 5 s passes at every item, so every 4th item decides
            bar.update()
    assert lines(out) == ["run 4, 0:40", "run 8, 1:20", "run 9, done in 1:30"]


def test_a_terminal_gets_a_tqdm_bar_and_no_plain_lines(monkeypatch):
    out, bars = io.StringIO(), []
    monkeypatch.setattr("cdlm.progress.tqdm", lambda **kw: bars.append(tqdm(**kw)) or bars[-1])
    assert list(progress(range(3), "timed run", tty=True, stream=out, every_s=0)) == [0, 1, 2]
    assert len(bars) == 1 and bars[0].n == 3 and bars[0].total == 3
    assert "\r" in out.getvalue() and "timed run" in out.getvalue()
    assert "done in" not in out.getvalue()


def test_the_stream_decides_without_tty():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert Progress(2, "x", stream=Terminal()).bar is not None
    assert Progress(2, "x", stream=io.StringIO()).bar is None


def test_turned_off_it_prints_nothing_on_either_stream():
    for tty in (True, False):
        out, clock = io.StringIO(), FakeClock()
        for _ in progress(range(5), "x", enabled=False, tty=tty, stream=out, clock=clock):
            clock.now += 60
        assert out.getvalue() == ""


def test_a_failure_leaves_no_done_line():
    out, clock = io.StringIO(), FakeClock()
    try:
        for i in progress(range(5), "x", stream=out, clock=clock):
            clock.now += 60
            if i == 2:
                raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert lines(out) == ["x 1/5, 1:00, about 4:00 left", "x 2/5, 2:00, about 3:00 left"]


class _Network(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))


class _Model:
    """Only what ``evaluate`` reads; the metric below ignores the process and denoiser."""

    network = _Network()
    process = None


def _metric(denoiser, process, tokens, generator=None):
    zeros = torch.zeros(len(tokens))
    return Elbo(zeros, zeros, zeros, total=zeros, nfe=1)


def test_evaluate_reports_its_batches_on_stderr(capsys, monkeypatch):
    monkeypatch.setattr("cdlm.likelihood.evaluate.likelihood_denoiser", lambda *a: None)
    tokens = torch.zeros(6, 4, dtype=torch.long)
    evaluate(_Model(), _metric, tokens, batch_size=2, num_batches=None, seed=0, desc="e batch")
    assert capsys.readouterr().err.splitlines()[-1].startswith("e batch 3/3, done in ")
    evaluate(_Model(), _metric, tokens, batch_size=2, num_batches=2, seed=0, show_progress=False)
    assert capsys.readouterr().err == ""
