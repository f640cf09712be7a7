"""experiments/speed.py and scripts/frontier.py end to end on tiny random models (scorer: a
uniform LM stand-in)."""

import importlib
import json
import sys
from pathlib import Path

import pytest
from conftest import train_tiny
from test_quality import CharTokenizer, UniformLM

from cdlm.evaluation.quality import Scorer
from cdlm.samplers import SAMPLERS

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str, folder: str):
    sys.path.insert(0, str(ROOT / folder))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / folder))


@pytest.fixture(scope="module")
def tiny_block_checkpoint(tmp_path_factory, tiny_corpus):
    return train_tiny(tmp_path_factory, tiny_corpus, "process=block", "process.block_size=4")


@pytest.fixture(scope="module")
def table(
    tiny_ar_checkpoint, tiny_masked_checkpoint, tiny_block_checkpoint, tiny_corpus, tmp_path_factory
):
    """The table at batches 1 and 2, 8 new tokens after no prompt or an 8-token one; masked
    blocks of 8 in 4 steps; the block model stands in for an SDTT student too."""
    speed = _script("speed", "experiments")
    out = tmp_path_factory.mktemp("speed") / "speed"
    args = speed.parse(
        [
            f"--ar={tiny_ar_checkpoint}",
            f"--masked={tiny_masked_checkpoint}",
            f"--block=block4={tiny_block_checkpoint}",
            f"--sdtt=sdtt4={tiny_block_checkpoint}",
            "--batches=1,2",
            "--prompt-tokens=8",
            "--new-tokens=8",
            "--masked-block=8",
            "--masked-steps-per-block=4",
            "--repeats=1",
            "--likelihood-sequences=2",
            f"--data={tiny_corpus}",
            f"--out={out}",
        ]
    )
    report = speed.run(args, Scorer(UniformLM(50), CharTokenizer(), "uniform-50"))
    return report, out


def test_every_row_is_measured_at_every_batch_with_and_without_the_prompt(table):
    report, out = table
    rows = report["rows"]
    assert json.loads(out.with_suffix(".json").read_text()) == report
    names = {r["name"] for r in rows}
    assert {"AR, KV cache, T=0 (greedy)", "sdtt4, 2 step(s)/block, cache"} <= names
    assert any("speculative" in n for n in names) == ("speculative" in SAMPLERS)
    assert len(rows) == len(names) * 2 * 2
    for r in rows:
        t = r["tokens_per_s"]
        assert t["min"] == t["median"] == t["max"]  # one timed run
        # new tokens only, the prompt's given ones not counted
        assert t["median"] * r["wall_seconds"]["median"] == pytest.approx(r["batch"] * 8)
        assert r["prompt_tokens"] == (8 if "gen_ppl" not in r else 0)
        first, stable = r["first_token_seconds"]["median"], r["first_stable_seconds"]["median"]
        assert 0 < first <= stable <= r["wall_seconds"]["median"]
        assert r["memory_kind"] == "rss" and r["peak_memory_mb"] > 0
        if "threshold" in r["name"] or "entropy-bounded" in r["name"]:
            g = r["guard"]
            assert g["by_guard"] + g["by_force"] == r["batch"] * 8
        else:
            assert r["guard"] is None
        assert (r["accepted_per_call"] is not None) == (r["sampler"] == "speculative")


def test_a_masked_prompt_row_spends_the_steps_of_its_no_prompt_row_per_block(table):
    """8 prompt tokens fill one decided block of 8: the prompt row's plan has 8 steps for two
    blocks, so that its one generated block gets 4, as the no-prompt row's does (the grid's
    steps shared over every block gave it 2)."""
    rows = [r for r in table[0]["rows"] if r["process"] == "masked"]
    assert len(rows) == 4 * 2 * 2
    for r in rows:
        prompt = r["prompt_tokens"] > 0
        assert r["steps"] == (8 if prompt else 4)
        # a random tiny model is never 90% sure: every step commits one token, the last the rest
        assert r["nfe"] == 4
        assert r["guard"]["by_guard"] == 0 and r["guard"]["by_force"] == r["batch"] * 8


def test_the_markdown_checks_the_goals_at_each_temperature(table):
    report, out = table
    text = out.with_suffix(".md").read_text()
    assert text.count("\n| AR, KV cache, T=1 |") == 4
    assert "- Batch 1 (goal: >= 3x AR's tokens/s" in text
    for t in ("T=1", "T=0"):
        assert f"  - {t}: " in text
    assert "Batch 16" not in text  # no batch-16 rows in this table
    assert "- Likelihood: the block-diffusion bound" in text


def test_the_frontier_plot_draws_the_new_json(table, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    frontier = _script("frontier", "scripts")
    _, out = table
    points = frontier.points(out.with_suffix(".json"))
    assert len(points) == sum(1 for r in table[0]["rows"] if r.get("gen_ppl"))
    png = tmp_path / "speed.png"
    monkeypatch.setattr(
        sys, "argv", ["frontier.py", str(out.with_suffix(".json")), "--out", str(png)]
    )
    frontier.main()
    assert png.stat().st_size > 0


def test_speculative_rows_wait_for_their_sampler_and_say_so(monkeypatch, capsys):
    speed = _script("speed", "experiments")
    args = speed.parse(["--ar=a", "--masked=m", "--block=b4=b", "--sdtt=s4=s"])
    with_it = [r.name for r in speed.rows_for(args)]
    monkeypatch.delitem(speed.SAMPLERS, "speculative", raising=False)
    without = [r.name for r in speed.rows_for(args)]
    assert "speculative rows skipped" in capsys.readouterr().out
    spec = ["b4, speculative greedy", "b4, speculative, T=1"]
    spec.append("b4, speculative greedy, AR verifier")
    assert [n for n in with_it if n not in without] == spec
    assert "s4, 1 step(s)/block, cache" in without and "AR, KV cache, T=0 (greedy)" in without


def _row(name, batch, t, tps, ppl, entropy, process="block", sampler="block"):
    return {
        "name": name, "process": process, "sampler": sampler, "ckpt": process, "batch": batch,
        "temperature": t, "prompt_tokens": 0, "new_tokens": 256,
        "nfe": 256 if process == "autoregressive" else 64,
        "tokens_per_s_median": tps, "wall_seconds": {"median": batch * 256 / tps},
        "gen_ppl": ppl, "entropy": entropy, "accepted_per_call": 4.0 if sampler != "block" else None,
    }  # fmt: skip


def test_each_row_is_judged_against_ar_at_its_own_temperature():
    """Greedy rows against greedy AR, sampled ones against AR at their temperature; speculative
    rows within AR's quality by construction (their measured gen-PPL is noise); batch 16's goal
    is 1.5x."""
    rows = []
    for batch, scale in ((1, 1), (16, 10)):
        rows += [
            _row("AR T=1", batch, 1.0, 100 * scale, 100, 6.0, "autoregressive", "ar"),
            _row("AR T=0.9", batch, 0.9, 110 * scale, 80, 5.5, "autoregressive", "ar"),
            _row("AR T=0", batch, 0.0, 120 * scale, 5, 2.0, "autoregressive", "ar"),
            _row("fast but poor", batch, 1.0, 500 * scale, 300, 6.0),
            _row("within", batch, 1.0, (320 if batch == 1 else 140) * scale, 105, 5.8),
            _row("greedy", batch, 0.0, 400 * scale, 5.2, 1.95),
            _row("spec", batch, 0.9, 200 * scale, 200, 5.5, sampler="speculative"),
        ]
    lines = _script("speed_report", "experiments").goals({"rows": rows, "bounds": {}})
    text = "\n".join(lines)
    assert "  - T=1: the fastest row within AR's quality is `within` (batch 1) at 3.20x " in text
    assert "`greedy` (batch 1) at 3.33x `AR T=0` (met)" in text
    assert "`spec` (batch 1) at 1.82x `AR T=0.9` (not met, short by 1.65x): quality by " in text
    assert "`within` (batch 16) at 1.40x `AR T=1` (not met, short by 1.07x)" in text
    assert "The fastest at any quality, `fast but poor`, runs at 5.00x AR" in text
    assert "4.00x AR's tokens per call (64 calls)" in text  # AR: 256 calls for 256 tokens
