"""The trajectory as pictures: a PNG strip of a few frames, or a GIF / MP4 of every frame.

Drawn with matplotlib (``pip install "cdlm[plots]"``): each token's text on a monospace grid,
its background in the colours of the terminal and HTML views (grey: undecided, yellow: changed
at this step, blue: fixed), a settled token's ink as dark as its confidence. GIF needs Pillow (a
matplotlib dependency), MP4 an ``ffmpeg``.
"""

from __future__ import annotations

import os
from pathlib import Path

from cdlm.canvas.html import trajectory_data
from cdlm.canvas.record import Recorder
from cdlm.io import atomic_path

COLUMNS = 96  # characters per line of a drawn canvas
FONT = 8.0  # points; a monospace character advances 0.6 em, so the grid is known in inches
CHAR = 0.6 * FONT / 72  # inches per character
LINE = 1.6 * FONT / 72  # inches per line
WIDTH = COLUMNS * CHAR / 0.98  # the axes span 98% of the figure
COLOURS = {"undecided": "#dddddd", "changed": "#ffe066", "fixed": "#cde8ff", "decided": "white"}
WRITERS = {".gif": "pillow", ".mp4": "ffmpeg"}


def _matplotlib():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib import animation
    except ImportError:
        raise ValueError(
            'canvas pictures (.png/.gif/.mp4) need matplotlib: pip install "cdlm[plots]"; '
            "canvas=out.html needs nothing"
        ) from None
    return plt, animation


def _layout(frame: dict, pieces: dict, fixed: list[bool]) -> list[tuple[int, int, str, str, float]]:
    """(line, column, text, colour, opacity) per position, wrapped at ``COLUMNS`` characters;
    a decided token's opacity is its confidence (at least 0.3, so that it stays legible)."""
    cells, line, col = [], 0, 0
    for i, token in enumerate(frame["tokens"]):
        text = pieces[token] if frame["decided"][i] else "·"
        state = (
            "undecided"
            if not frame["decided"][i]
            else "fixed"
            if fixed[i]
            else "changed"
            if frame["changed"][i]
            else "decided"
        )
        opacity = max(0.3, frame["confidence"][i]) if state == "decided" else 1.0
        parts = text.split("\n")
        for k, part in enumerate(parts):
            if col + len(part) > COLUMNS and col > 0:
                line, col = line + 1, 0
            cells.append((line, col, part, COLOURS[state], opacity))
            col += len(part)
            if k < len(parts) - 1:
                line, col = line + 1, 0
    return cells


def _draw(ax, frame: dict, pieces: dict, fixed: list[bool], lines: int, title: str) -> None:
    ax.clear()
    ax.set_xlim(0, COLUMNS)
    ax.set_ylim(lines + 0.5, -1.2)
    ax.axis("off")
    ax.text(0, -0.9, title, family="monospace", fontsize=FONT, weight="bold", va="center")
    for line, col, text, colour, opacity in _layout(frame, pieces, fixed):
        if text:
            ax.text(
                col,
                line,
                text,
                alpha=opacity,
                family="monospace",
                fontsize=FONT,
                va="center",
                bbox={"facecolor": colour, "edgecolor": "none", "pad": 0.3},
            )


def _title(frame: dict, n: int) -> str:
    decided = sum(frame["decided"])
    return (
        f"step {frame['step'] + 1}/{n} · NFE {frame['nfe']} · t {frame['t']:.3f} → "
        f"{frame['s']:.3f} · {decided}/{len(frame['tokens'])} decided"
    )


def write_picture(
    path: str | Path, recorder: Recorder, tokenizer, sample: int = 0, frames: int = 6
) -> None:
    """``.png``: ``frames`` evenly spaced frames of sample ``sample`` stacked top to bottom;
    ``.gif`` / ``.mp4``: every frame, one per 150 ms."""
    path = Path(path)
    plt, animation = _matplotlib()
    data = trajectory_data(recorder, tokenizer)
    trajectory = data["samples"][sample]["frames"]
    pieces, fixed, n = data["pieces"], data["fixed"], len(trajectory)
    lines = max(_layout(f, pieces, fixed)[-1][0] for f in trajectory) + 1
    height = LINE * (lines + 2.5)
    if path.suffix == ".png":
        picks = sorted({round(k * (n - 1) / max(1, frames - 1)) for k in range(frames)})
        fig, axes = plt.subplots(len(picks), 1, figsize=(WIDTH, height * len(picks)), squeeze=False)
        fig.subplots_adjust(left=0.01, right=0.99, top=0.99, bottom=0.01, hspace=0.05)
        for ax, k in zip(axes[:, 0], picks, strict=True):
            _draw(ax, trajectory[k], pieces, fixed, lines, _title(trajectory[k], n))
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=120, format="png")
        plt.close(fig)
        return
    writer = WRITERS.get(path.suffix)
    if writer is None or not animation.writers.is_available(writer):
        raise ValueError(
            f"canvas={path}: no {writer or path.suffix} writer here; .html always works, .png "
            f"and .gif need matplotlib, .mp4 also ffmpeg"
        )
    fig, ax = plt.subplots(figsize=(WIDTH, height))
    fig.subplots_adjust(left=0.01, right=0.99, top=0.99, bottom=0.01)

    def update(k: int) -> None:
        _draw(ax, trajectory[k], pieces, fixed, lines, _title(trajectory[k], n))

    movie = animation.FuncAnimation(fig, update, frames=n, interval=150)
    tmp = path.with_name(f".{path.stem}.partial{path.suffix}")  # writers read the suffix
    try:
        movie.save(str(tmp), writer=writer, fps=7)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
        plt.close(fig)
