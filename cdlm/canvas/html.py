"""The whole trajectory as one self-contained HTML page with a slider.

No server and no script from elsewhere: the frames are embedded as JSON and drawn by a few
lines of JavaScript. Colour by state (undecided, changed at this step, fixed, decided), by
confidence (each token's probability: a gaussian position's argmax under the step's prediction,
a committed token at its commit) or by commit order (the step at which each position was first
decided: the order a masked or autoregressive sampler wrote the text in).
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from cdlm.canvas.record import Frame, Recorder
from cdlm.canvas.terminal import LINE_BREAK, Pieces
from cdlm.io import atomic_write_text

# the canvas's look, shared with cdlm-serve's page (cdlm.serve.page)
STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;max-width:70em}
#canvas{font-family:ui-monospace,monospace;white-space:pre-wrap;line-height:1.7;
 border:1px solid #ccc;padding:.8em;min-height:8em}
#canvas span{border-radius:3px}
.u{color:#bbb}.c{background:#ffe066;font-weight:bold}.f{background:#cde8ff}
label{margin-right:1.2em}#info{color:#555;margin:.4em 0}
"""

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>%(title)s</title>
<style>%(style)s</style></head><body>
<h2>%(title)s</h2><p>%(meta)s</p>
<div><label>sample <select id="sample"></select></label>
<label>colour <select id="mode"><option value="state">state</option>
<option value="confidence">confidence</option><option value="order">commit order</option>
</select></label><button id="play">play</button></div>
<div><input id="slider" type="range" min="0" value="0" style="width:100%%"></div>
<div id="info"></div><div id="canvas"></div>
<p style="color:#777">state: <span class="u">· undecided</span>, <span class="c">changed at
this step</span>, <span class="f">fixed</span>; hover a token for its position, id,
probability and commit step.</p>
<script>
const D = %(data)s;
const $ = id => document.getElementById(id);
D.samples.forEach((s, k) => $("sample").add(new Option(k, k)));
function draw() {
  const s = D.samples[+$("sample").value], f = s.frames[+$("slider").value];
  const mode = $("mode").value, n = s.frames.length;
  $("info").textContent = `step ${f.step + 1} of ${n} · NFE ${f.nfe} · t ${f.t.toFixed(3)}` +
    ` → ${f.s.toFixed(3)} · ${f.decided.filter(Boolean).length}/${f.tokens.length} decided`;
  const out = f.tokens.map((tok, i) => {
    const piece = f.decided[i] ? (D.pieces[tok] ?? "?") : "·";
    const p = f.confidence[i], order = s.order[i], fixed = D.fixed[i];
    let cls = "", style = "";
    if (!f.decided[i]) cls = "u";
    else if (mode === "state") cls = fixed ? "f" : (f.changed[i] ? "c" : "");
    else if (mode === "confidence") style = `background:rgba(40,160,70,${p.toFixed(2)})`;
    else if (order >= 0) style = `background:hsl(${(240 * order / n).toFixed(0)},80%%,80%%)`;
    else if (fixed) cls = "f";
    const tip = `position ${i} · id ${tok} · p ${p.toFixed(3)} · committed at step ${order + 1}`;
    const text = piece.replace(/&/g, "&amp;").replace(/</g, "&lt;");
    return `<span class="${cls}" style="${style}" title="${tip}">${text}</span>`;
  });
  $("canvas").innerHTML = out.join("");
}
function pick() {
  const n = D.samples[+$("sample").value].frames.length;
  $("slider").max = n - 1; $("slider").value = n - 1; draw();
}
let timer = null;
$("play").onclick = () => {
  if (timer) { clearInterval(timer); timer = null; return; }
  $("slider").value = 0;
  timer = setInterval(() => {
    if (+$("slider").value >= +$("slider").max) { clearInterval(timer); timer = null; return; }
    $("slider").value = +$("slider").value + 1; draw();
  }, 120);
};
$("slider").oninput = draw; $("mode").onchange = draw; $("sample").onchange = pick; pick();
</script></body></html>
"""


def frame_data(f: Frame, row: int, length: int | None = None) -> dict:
    """Row ``row`` of frame ``f`` (its first ``length`` positions; None: all) as plain lists:
    what the page draws, here and in ``cdlm-serve``'s canvas stream."""
    cut = slice(0, length)
    return {
        "step": f.step,
        "t": f.t,
        "s": f.s,
        "nfe": f.nfe,
        "tokens": f.tokens[row, cut].tolist(),
        "decided": f.decided[row, cut].tolist(),
        "changed": f.changed[row, cut].tolist(),
        "confidence": [round(p, 3) for p in f.confidence[row, cut].tolist()],
    }


def trajectory_data(recorder: Recorder, tokenizer) -> dict:
    """The recorded frames of every sample as plain lists, with each used token's text."""
    pieces, used, samples = Pieces(tokenizer), set(), []
    for trajectory, row in recorder.rows():
        frames = [frame_data(f, row) for f in trajectory.frames]
        for frame in frames:
            used.update(frame["tokens"])
        samples.append({"frames": frames, "order": trajectory.order[row].tolist()})
    length = len(samples[0]["frames"][0]["tokens"]) if samples else 0
    fixed = recorder.fixed.tolist() if recorder.fixed is not None else [False] * length
    return {
        "pieces": {t: pieces(t).replace(LINE_BREAK, "↵\n") for t in sorted(used)},
        "samples": samples,
        "fixed": fixed,
    }


def write_html(path: str | Path, recorder: Recorder, tokenizer, title: str, meta: str) -> None:
    """Writes the page atomically; ``meta`` is one line about the run (model, sampler, steps)."""
    if not recorder.trajectories:
        raise ValueError("nothing was recorded: the sampler made no step")
    data = json.dumps(trajectory_data(recorder, tokenizer), separators=(",", ":"))
    page = PAGE % {
        "style": STYLE,
        "title": html.escape(title),
        "meta": html.escape(meta),
        "data": data.replace("</", "<\\/"),  # a token text cannot close the script
    }
    atomic_write_text(path, page)
