"""``process=uniform init_from=<a masked model>`` (docs/guide/levers.md, "Uniform from a masked
or AR model"): the run starts from the masked network's very weights, reads text through that
model's tokenizer (its embedding rows mean its tokens), trains, and a network that does not fit
is refused in one line."""

import pytest
import torch
from conftest import TINY_TRAIN, run_main, train_tiny
from hydra import compose, initialize_config_dir

from cdlm.cli.common import config_dir
from cdlm.model_file import load_model
from cdlm.run.build import build

SIZES = [o for o in TINY_TRAIN if o.startswith(("network.", "data.seq_len"))]
SHORT = [o for o in TINY_TRAIN if not o.startswith(("network.d_model", "data.vocab_size"))]


@pytest.fixture(scope="module")
def masked(tmp_path_factory, tiny_corpus):
    """A tiny unshifted masked model (vocabulary 300) without an AR phase."""
    return train_tiny(
        tmp_path_factory, tiny_corpus, "process=masked", "process.shift=false", "phases=none"
    )


@pytest.fixture(scope="module")
def autoregressive(tmp_path_factory, tiny_corpus):
    return train_tiny(tmp_path_factory, tiny_corpus, "process=autoregressive")


@pytest.mark.parametrize("start", ["masked", "autoregressive"])
def test_uniform_starts_from_the_networks_weights(start, request, tiny_corpus):
    """The masked or AR network, every parameter; the run's own data options ask for another
    vocabulary, and the started model's tokenizer wins."""
    path = request.getfixturevalue(start)
    overrides = ["process=uniform", f"init_from={path}", f"data.path={tiny_corpus}"]
    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        cfg = compose("train", overrides=[*overrides, *SIZES, "data.vocab_size=280"])
    parts = build(cfg)
    source = load_model(path)
    assert type(parts.process).__name__ == "UniformProcess"
    assert parts.data.tokenizer.get_vocab() == source.tokenizer.get_vocab()
    mine, theirs = parts.network.state_dict(), source.network.state_dict()
    assert mine.keys() == theirs.keys()
    for name, value in theirs.items():
        assert torch.equal(mine[name], value), name


def test_uniform_from_masked_trains_from_those_weights(masked, tmp_path_factory, tiny_corpus):
    """Three AdamW steps at lr 1e-3 move each weight by at most ~3e-3 (Adam's step is about lr):
    the trained network is the masked one, moved a little; a fresh start would be far off."""
    path = train_tiny(tmp_path_factory, tiny_corpus, "process=uniform", f"init_from={masked}")
    trained, source = load_model(path), load_model(masked)
    assert trained.config["process"]["_target_"].endswith("UniformProcess")
    moves = [
        (trained.network.state_dict()[name] - value).abs().max().item()
        for name, value in source.network.state_dict().items()
    ]
    assert 0 < max(moves) <= 3 * 1e-3 * 1.5, moves


def test_a_network_that_does_not_fit_is_refused_in_one_line(masked, tiny_corpus, tmp_path):
    result = run_main(
        "cdlm-train",
        "process=uniform",
        f"init_from={masked}",
        f"data.path={tiny_corpus}",
        *SHORT,
        "network.d_model=48",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and len(lines) == 1, result.stderr[-2000:]
    assert "its network does not fit this run's: " in lines[0]
    assert "is (300, 32) there, (300, 48) here" in lines[0] and "more)" in lines[0]
