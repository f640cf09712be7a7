"""A denoising canvas to watch: every step of a sampler, recorded through its callback, shown
live in the terminal (``cdlm-sample show=canvas``) or saved whole (``canvas=out.html``, or
``.png`` / ``.gif`` / ``.mp4`` where matplotlib and a writer are installed)."""

from __future__ import annotations

from pathlib import Path

from cdlm.canvas.html import write_html
from cdlm.canvas.record import Frame, Recorder, Trajectory
from cdlm.canvas.terminal import LiveCanvas, render

FORMATS = (".html", ".png", ".gif", ".mp4")

__all__ = ["FORMATS", "Frame", "LiveCanvas", "Recorder", "Trajectory", "render", "save"]


def save(path: str | Path, recorder: Recorder, tokenizer, title: str, meta: str = "") -> None:
    """Writes the recorded trajectory in the format the suffix of ``path`` names."""
    path = Path(path)
    if path.suffix not in FORMATS:
        raise ValueError(f"canvas={path}: unknown format; valid: {', '.join(FORMATS)}")
    if path.suffix == ".html":
        write_html(path, recorder, tokenizer, title, meta)
        return
    from cdlm.canvas.picture import write_picture  # matplotlib only when a picture is asked for

    write_picture(path, recorder, tokenizer)
