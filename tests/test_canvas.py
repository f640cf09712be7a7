"""The denoising canvas, recorded through the sampler callback: for gaussian, masked and AR the
last recorded frame is the sample, NFE and decided positions follow the sampler, and the live
terminal view, the HTML page and the pictures are drawn from the same frames."""

from __future__ import annotations

import io
import json
import re

import pytest
import torch
from conftest import draw_from, run_main, train_tiny

from cdlm.canvas import LiveCanvas, Recorder, render, save
from cdlm.canvas.terminal import Pieces
from cdlm.generation import named_sampler
from cdlm.model_file import load_model
from cdlm.regions import build_layout, prompt_template

SAMPLERS = {
    "tiny_checkpoint": "ddpm",
    "tiny_masked_checkpoint": "ancestral",
    "tiny_ar_checkpoint": "ar",
}


def record(model, sampler: str, steps: int = 5, fixed=None, **options):
    recorder = Recorder(model.process, fixed=fixed)
    gen = draw_from(
        model.process,
        model.network,
        model.tokenizer,
        named_sampler(sampler),
        steps=steps,
        num_samples=3,
        batch_size=2,  # two batches: two trajectories
        seq_len=model.config["seq_len"],
        seed=1,
        callback=recorder,
        **options,
    )
    return recorder, gen


@pytest.mark.parametrize("fixture", list(SAMPLERS))
def test_the_last_frame_is_the_sample(fixture, request):
    model = load_model(request.getfixturevalue(fixture))
    recorder, gen = record(model, SAMPLERS[fixture], cut_at_eos=False)
    assert [tr.first for tr in recorder.trajectories] == [0, 2]
    rows = recorder.rows()
    assert len(rows) == 3
    for sample, (trajectory, row) in zip(gen.samples, rows, strict=True):
        last = trajectory.frames[-1]
        n = int(last.decided[row].sum())
        # an AR row that stopped at EOS is EOS-padded after its last step; the rest is exact
        assert last.tokens[row, :n].tolist() == sample.token_ids[:n]
        assert all(t == model.tokenizer.eos_token_id for t in sample.token_ids[n:])
        if model.process.kind != "autoregressive":
            assert bool(last.decided[row].all())
    assert recorder.trajectories[-1].frames[-1].nfe == gen.nfe


def test_masked_frames_commit_and_never_revise(tiny_masked_checkpoint):
    model = load_model(tiny_masked_checkpoint)
    recorder, _ = record(model, "ancestral", steps=6)
    trajectory = recorder.trajectories[0]
    decided = [int(f.decided[0].sum()) for f in trajectory.frames]
    assert decided == sorted(decided) and decided[-1] == model.config["seq_len"]
    for before, after in zip(trajectory.frames, trajectory.frames[1:], strict=False):
        kept = before.decided & after.decided
        assert torch.equal(before.tokens[kept], after.tokens[kept])
        assert torch.equal(after.changed, after.decided & ~before.decided)
    order = trajectory.order
    for frame in trajectory.frames:  # a position's commit step is the first frame deciding it
        assert torch.equal(frame.decided, (order >= 0) & (order <= frame.step))


def test_fixed_prompt_is_shown_apart_and_nfe_counts_cached_steps(tiny_masked_checkpoint):
    model = load_model(tiny_masked_checkpoint)
    length = model.config["seq_len"]
    canvas = build_layout(prompt_template("It is a truth"), model.tokenizer, length, 0)
    fixed = torch.tensor([not e for e in canvas.editable])
    recorder, gen = record(model, "cached_ancestral", steps=12, fixed=fixed, layout=canvas)
    first = recorder.trajectories[0].frames[0]
    assert bool(first.decided[:, fixed].all())
    assert bool((recorder.trajectories[0].order[:, fixed] == -1).all())  # never "committed"
    nfes = [f.nfe for f in recorder.trajectories[-1].frames]  # gen.nfe: the last batch's
    assert nfes[-1] == gen.nfe and nfes == sorted(nfes) and len(nfes) > gen.nfe  # cached
    text = render(first, 0, Pieces(model.tokenizer), fixed, steps=12)
    assert "\x1b[36m" in text  # cyan fixed region
    assert text.startswith("\x1b[1;33mstep 1/12 · NFE 1 · t 1.000")


def test_live_canvas_redraws_each_frame(tiny_checkpoint):
    model = load_model(tiny_checkpoint)
    stream = io.StringIO()
    live = LiveCanvas(model.tokenizer, steps=4, stream=stream)
    recorder, _ = record(model, "ddim", steps=4)
    for trajectory in recorder.trajectories:
        for frame in trajectory.frames:
            live(frame, trajectory)
    out = stream.getvalue()
    assert out.count("step ") == 8 and "NFE 4" in out
    assert "\x1b[" not in out  # not a terminal: plain text, appended


@pytest.mark.parametrize("fixture", list(SAMPLERS))
def test_html_page_holds_every_frame(fixture, request, tmp_path):
    model = load_model(request.getfixturevalue(fixture))
    recorder, gen = record(model, SAMPLERS[fixture], cut_at_eos=False)
    path = tmp_path / "canvas.html"
    save(path, recorder, model.tokenizer, "title", "meta")
    page = path.read_text()
    data = json.loads(re.search(r"const D = (.*);\n", page).group(1).replace("<\\/", "</"))
    assert len(data["samples"]) == 3
    last = data["samples"][0]["frames"][-1]
    n = sum(last["decided"])
    assert last["tokens"][:n] == gen.samples[0].token_ids[:n]
    frames = data["samples"][0]["frames"]
    assert len(frames) == len(recorder.trajectories[0].frames)


def test_png_strip_and_gif(tiny_masked_checkpoint, tmp_path):
    pytest.importorskip("matplotlib")
    model = load_model(tiny_masked_checkpoint)
    recorder, _ = record(model, "ancestral", steps=4)
    for name in ("strip.png", "movie.gif"):
        save(tmp_path / name, recorder, model.tokenizer, "t")
        assert (tmp_path / name).stat().st_size > 1000
    with pytest.raises(ValueError, match="unknown format"):
        save(tmp_path / "x.txt", recorder, model.tokenizer, "t")


def test_cli_show_canvas_and_canvas_file(tiny_masked_checkpoint, tmp_path):
    args = (f"ckpt={tiny_masked_checkpoint}", "steps=3", "num_samples=2", "show=canvas")
    result = run_main("cdlm-sample", *args, "canvas=c.html", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stderr.count("step ") >= 3 and "NFE" in result.stderr
    assert "wrote the canvas of every step to c.html" in result.stdout
    assert (tmp_path / "c.html").is_file()
    result = run_main("cdlm-sample", *args, "canvas=c.txt", cwd=tmp_path)
    assert result.returncode == 2 and "valid formats: .html" in result.stderr


def test_uniform_frames_revise_and_count_the_sampler_revisions(tmp_path_factory, tiny_corpus):
    """Uniform-state decoding may change any token at any step: every frame shows a whole
    canvas, later frames revise tokens, and the frames' changes after the first add up to the
    sampler's own ``revisions`` less the first step's changes from the (unrecorded) prior."""
    model = load_model(train_tiny(tmp_path_factory, tiny_corpus, "process=uniform"))
    recorder, gen = record(model, "duo_ancestral", steps=6, cut_at_eos=False)
    for trajectory, row in recorder.rows():
        assert (
            trajectory.frames[-1].tokens[row].tolist()
            == gen.samples[trajectory.first + row].token_ids
        )
    assert all(bool(f.decided.all()) for tr in recorder.trajectories for f in tr.frames)
    per_batch = [
        sum(float(f.changed.sum(-1).double().mean()) for f in tr.frames[1:])
        for tr in recorder.trajectories
    ]  # the sampler's figure is a mean over batches of its per-batch mean
    later = sum(per_batch) / len(per_batch)
    assert later > 0  # some token was revised after the first step
    length = model.config["seq_len"]
    assert later - 1e-9 <= gen.stats["revisions"] <= later + length + 1e-9
