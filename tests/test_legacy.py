"""Model files written before the process seams (flags and step counts in the process config)
still load, and sample exactly what the code that wrote them sampled."""

import json
from pathlib import Path

import pytest
from conftest import draw

from cdlm.legacy import upgrade_process
from cdlm.model_file import load_model

LEGACY = Path(__file__).parent / "data" / "legacy"


@pytest.mark.parametrize("kind", ["gaussian", "masked"])
def test_old_model_files_sample_as_before(kind):
    """tests/data/legacy/*.safetensors: 2-step models trained by commit 683937b (AR phase and
    all); samples.json: what its cdlm-sample drew from them at steps=4 seed=0."""
    model = load_model(LEGACY / f"{kind}.safetensors")
    gen = draw(model, steps=4, num_samples=2, seed=0)
    expected = json.loads((LEGACY / "samples.json").read_text())[kind]
    assert [s.token_ids for s in gen.samples] == expected


def test_old_gaussian_flags_become_pieces():
    old = {
        "_target_": "cdlm.processes.gaussian.GaussianProcess",
        "objective": "mse",
        "readout_skip": False,
        "posterior_input": False,
        "shift": False,
        "self_cond_prob": 0.5,
        "ar_steps": 0,
        "anneal_steps": 0,
    }
    new = upgrade_process(old)
    assert new["objective"]["_target_"].endswith("X0MSE")
    assert new["input"] == {
        "_target_": "cdlm.processes.parameterization.VectorInput",
        "self_cond_prob": 0.5,
    }
    assert not {"ar_steps", "anneal_steps", "shift", "readout_skip"} & set(new)
    assert upgrade_process(new) == new  # today's form passes through
