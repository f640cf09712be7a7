"""The page ``cdlm-serve`` shows at ``/``: a prompt or an infill template sent to
``/v1/completions`` with ``stream_canvas``, its canvas drawn at every step as the saved canvas
draws it (``cdlm.canvas.html``'s look: undecided, changed, fixed), then the final text. Its
address can carry a request (``/?prompt=...&seed=3&run=1``), so a link reproduces a sample."""

from __future__ import annotations

import html

from cdlm.canvas.html import STYLE

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>cdlm-serve: %(model)s</title>
<style>%(style)s
textarea{width:100%%;font-family:ui-monospace,monospace}
input[type=number]{width:6em}#text{white-space:pre-wrap;border-left:3px solid #6a6;padding-left:.6em}
#error{color:#b00}
</style></head><body>
<h2>cdlm-serve</h2><p>%(model)s</p>
<form id="form">
<div><label><input type="radio" name="mode" value="prompt" checked> prompt</label>
<label><input type="radio" name="mode" value="infill"> infill template ([[N]]: N tokens)</label></div>
<textarea id="input" rows="3"></textarea>
<div><label>max tokens <input id="max_tokens" type="number" min="1" value="48"></label>
<label>steps <input id="steps" type="number" min="1" value="32"></label>
<label>sampler <select id="sampler"><option value="">default</option>%(samplers)s</select></label>
<label>seed <input id="seed" type="number" value="0"></label>
<label>guidance <input id="guidance_scale" type="number" min="0" step="0.5" value="1"></label>
<button id="go" type="submit">sample</button></div>
</form>
<div id="info"></div><div id="canvas"></div><p id="error"></p>
<h3>text</h3><div id="text"></div>
<p style="color:#777">canvas: <span class="u">· undecided</span>, <span class="c">changed at
this step</span>, <span class="f">fixed</span> (the prompt).</p>
<script>
const $ = id => document.getElementById(id);
function escape(t) { return t.replace(/&/g, "&amp;").replace(/</g, "&lt;"); }
function draw(c) {
  $("info").textContent = `step ${c.step + 1} · NFE ${c.nfe} · t ${c.t.toFixed(3)} → ` +
    `${c.s.toFixed(3)} · ${c.decided.filter(Boolean).length}/${c.tokens.length} decided`;
  $("canvas").innerHTML = c.pieces.map((p, i) => {
    const cls = !c.decided[i] ? "u" : c.fixed[i] ? "f" : c.changed[i] ? "c" : "";
    return `<span class="${cls}">${escape(c.decided[i] ? p : "·")}</span>`;
  }).join("");
}
$("form").onsubmit = async event => {
  event.preventDefault();
  $("go").disabled = true; $("text").textContent = ""; $("error").textContent = "";
  const body = {stream: true, stream_canvas: true, seed: +$("seed").value,
                steps: +$("steps").value, guidance_scale: +$("guidance_scale").value};
  const infill = document.querySelector("input[name=mode]:checked").value === "infill";
  if (infill) body.infill = $("input").value;
  else { body.prompt = $("input").value; body.max_tokens = +$("max_tokens").value; }
  if ($("sampler").value) body.sampler = $("sampler").value;
  try {
    const answer = await fetch("/v1/completions", {method: "POST",
      headers: {"content-type": "application/json"}, body: JSON.stringify(body)});
    if (!answer.ok) { $("error").textContent = (await answer.json()).error.message; return; }
    const reader = answer.body.getReader(), decoder = new TextDecoder();
    let buffer = "", text = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, {stream: true});
      let cut;
      while ((cut = buffer.indexOf("\\n\\n")) >= 0) {
        const line = buffer.slice(0, cut); buffer = buffer.slice(cut + 2);
        if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
        const event = JSON.parse(line.slice(6));
        if (event.canvas) draw(event.canvas);
        text += event.choices[0].text;
        $("text").textContent = text;
      }
    }
    $("text").dataset.done = "1";
  } catch (e) { $("error").textContent = String(e); }
  finally { $("go").disabled = false; }
};
// a link can hold a request: /?prompt=...&seed=3&steps=16 (infill=... for a template), run=1
// sends it on load
const query = new URLSearchParams(location.search);
if (query.has("infill")) {
  document.querySelector("input[value=infill]").checked = true;
  $("input").value = query.get("infill");
} else if (query.has("prompt")) $("input").value = query.get("prompt");
for (const key of ["max_tokens", "steps", "sampler", "seed", "guidance_scale"])
  if (query.has(key)) $(key).value = query.get(key);
if (query.get("run") === "1") $("form").requestSubmit();
</script></body></html>
"""


def page(model: str, samplers: tuple[str, ...]) -> str:
    """The page for ``model``, its sampler menu listing ``samplers``."""
    options = "".join(f'<option value="{s}">{s}</option>' for s in samplers)
    return PAGE % {"style": STYLE, "model": html.escape(model), "samplers": options}
