import importlib
import json

import pytest
import torch
from safetensors.torch import save_file

from cdlm.data.corpus import Document
from cdlm.data.tokenizer import train_bpe, wrap
from cdlm.model_file import MOVED, Model, ModelFileError, load_model, save_model
from cdlm.networks.transformer import Transformer
from cdlm.processes.gaussian import GaussianProcess
from cdlm.processes.inputs import PosteriorInput
from cdlm.schedules import SqrtSchedule


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    tok = wrap(train_bpe([Document("the cat sat on the mat " * 20, "x")], 280).to_str())
    process = GaussianProcess(vocab_size=len(tok), embed_dim=8, schedule=SqrtSchedule())
    network = Transformer(
        in_dim=8, out_dim=len(tok), d_model=32, n_layers=1, n_heads=2, max_seq_len=16
    )
    config = {
        "process": {
            "_target_": "cdlm.processes.gaussian.GaussianProcess",
            "vocab_size": len(tok),
            "embed_dim": 8,
            "schedule": {"_target_": "cdlm.schedules.SqrtSchedule"},
        },
        "network": {
            "_target_": "cdlm.networks.transformer.Transformer",
            "in_dim": 8,
            "out_dim": len(tok),
            "d_model": 32,
            "n_layers": 1,
            "n_heads": 2,
            "max_seq_len": 16,
        },
        "seq_len": 16,
        "labels": ["x"],
    }
    return Model(process, network, tok, config)


def test_round_trip_gives_identical_predictions(model, tmp_path):
    path = tmp_path / "m.safetensors"
    save_model(path, model)
    loaded = load_model(path)
    x, t = torch.randn(2, 16, 8), torch.rand(2)
    torch.testing.assert_close(loaded.denoiser(x, t).logits, model.denoiser(x, t).logits)
    assert isinstance(loaded.process.schedule, SqrtSchedule)
    assert loaded.tokenizer.decode(loaded.tokenizer("the cat")["input_ids"]) == "the cat"
    assert loaded.config["labels"] == ["x"]


def test_failed_write_keeps_the_previous_file(model, tmp_path, monkeypatch):
    path = tmp_path / "m.safetensors"
    save_model(path, model)
    before = path.read_bytes()

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("cdlm.model.save_file", broken)
    with pytest.raises(OSError):
        save_model(path, model)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["m.safetensors"]


def test_missing_corrupt_and_foreign_files_are_refused(tmp_path):
    with pytest.raises(ModelFileError, match="not found"):
        load_model(tmp_path / "nope.safetensors")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x00garbage" * 10)
    with pytest.raises(ModelFileError, match="cannot read"):
        load_model(bad)
    foreign = tmp_path / "foreign.safetensors"
    save_file({"w": torch.zeros(2)}, str(foreign))
    with pytest.raises(ModelFileError, match="not a cdlm checkpoint"):
        load_model(foreign)


def _stored(model, path):
    """The saved file's metadata and tensors, to damage and write back."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    save_model(path, model)
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    return meta, load_file(str(path))


@pytest.mark.parametrize("target", ["os.system", "torch.load", "cdlm.model.save_model"])
def test_configs_may_only_name_cdlm_classes(model, tmp_path, target):
    # a function target, torch's or cdlm's own, would run with the file's arguments
    path = tmp_path / "evil.safetensors"
    meta, tensors = _stored(model, path)
    good = json.loads(meta["config"])
    network = good | {"network": good["network"] | {"_target_": target}}
    # hydra instantiates list items too (process.prediction is a list of pieces)
    evil = [{"_target_": target, "command": "true"}]
    listed = good | {"process": good["process"] | {"prediction": evil}}
    for config in (network, listed):
        meta["config"] = json.dumps(config)
        save_file(tensors, str(path), metadata=meta)
        with pytest.raises(ModelFileError, match=f"disallowed class '{target}'"):
            load_model(path)


def _drop(meta, key):
    return {k: v for k, v in meta.items() if k != key}


def _reconfig(meta, change):
    return meta | {"config": json.dumps(change(json.loads(meta["config"])))}


def _untarget(config):  # a flipped bit in the key: instantiate would hand the dict back
    network = {("_targez_" if k == "_target_" else k): v for k, v in config["network"].items()}
    return config | {"network": network}


@pytest.mark.parametrize(
    "damage, named",
    [  # each found by tests/test_fuzz.py as a traceback before it was named
        (lambda m: _drop(m, "tokenizer"), "its cdlm metadata is damaged"),
        (lambda m: m | {"special_tokens": "[1]"}, "its cdlm metadata is damaged"),
        (lambda m: m | {"config": "[1, 2]"}, "its cdlm metadata is damaged"),
        (lambda m: m | {"tokenizer": "{not json"}, "its stored tokenizer is damaged"),
        (lambda m: _reconfig(m, lambda c: _drop(c, "network")), "its config has no network"),
        (lambda m: _reconfig(m, _untarget), "its network config names no class"),
    ],
)
def test_damaged_metadata_is_named_in_one_line(model, tmp_path, damage, named):
    path = tmp_path / "damaged.safetensors"
    meta, tensors = _stored(model, path)
    save_file(tensors, str(path), metadata=damage(meta))
    with pytest.raises(ModelFileError) as error:
        load_model(path)
    assert named in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(
    "part, change, named",
    [
        ("process", {"ar_steps": 1}, "unexpected keyword argument 'ar_steps'"),  # an old layout
        ("network", {"_target_": "cdlm.networks.gone.Net"}, "No module named 'cdlm.networks.gone'"),
    ],
)
def test_a_config_this_version_cannot_build_is_named_in_one_line(
    model, tmp_path, part, change, named
):
    path = tmp_path / "old.safetensors"
    save_model(path, model)
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    config = json.loads(meta["config"])
    config[part] |= change
    meta["config"] = json.dumps(config)
    save_file(load_file(str(path)), str(path), metadata=meta)
    with pytest.raises(ModelFileError) as error:
        load_model(path)
    message = str(error.value)
    assert "\n" not in message
    assert f"its {part} config does not fit this version of cdlm" in message and named in message


def test_a_file_naming_a_moved_class_by_its_old_path_loads_with_the_new_name(tmp_path):
    """Files written before ``cdlm.processes.parameterization`` was split record its inputs
    there; they load, and the loaded config (a distillation teacher's, say) names today's."""
    torch.manual_seed(0)
    tok = wrap(train_bpe([Document("the cat sat on the mat " * 20, "x")], 280).to_str())
    process = GaussianProcess(vocab_size=len(tok), embed_dim=8, input=PosteriorInput(shift=False))
    net_kwargs = {"d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 16}
    network = Transformer(**net_kwargs, **process.network_kwargs)
    old = "cdlm.processes.parameterization.PosteriorInput"
    config = {
        "process": {
            "_target_": "cdlm.processes.gaussian.GaussianProcess",
            "vocab_size": len(tok),
            "embed_dim": 8,
            "input": {"_target_": old, "shift": False},
        },
        "network": {"_target_": "cdlm.networks.transformer.Transformer"}
        | net_kwargs
        | process.network_kwargs,
        "seq_len": 16,
        "labels": [],
    }
    model = Model(process, network, tok, config)
    save_model(tmp_path / "m.safetensors", model)
    loaded = load_model(tmp_path / "m.safetensors")
    assert isinstance(loaded.process.input, PosteriorInput)
    assert loaded.config["process"]["input"]["_target_"] == "cdlm.processes.inputs.PosteriorInput"
    x, t = torch.randn(2, 16, 8), torch.rand(2)
    torch.testing.assert_close(loaded.denoiser(x, t).logits, model.denoiser(x, t).logits)


def test_every_moved_name_maps_to_a_class_that_exists():
    for old, new in MOVED.items():
        module, name = new.rsplit(".", 1)
        assert getattr(importlib.import_module(module), name).__name__ == old.rsplit(".", 1)[1]


@pytest.mark.parametrize("stored", [None, True, False])
def test_a_block_model_stored_before_the_tail_keeps_its_blind_layout(model, tmp_path, stored):
    """A block model's file from before issue 51 (no ``sees_last`` in its process) was trained
    blind to each block's last token: it loads in that layout; a newer file keeps its own."""
    from cdlm.processes.block import BlockProcess

    tok = model.tokenizer
    mask, eos = tok.mask_token_id, tok.eos_token_id
    process = BlockProcess(len(tok), mask, 2, eos, shift=True)
    network = Transformer(
        d_model=16, n_layers=1, n_heads=2, max_seq_len=17, **process.network_kwargs
    )
    config = {
        "process": {"_target_": "cdlm.processes.block.BlockProcess", "vocab_size": len(tok)}
        | {"mask_id": mask, "block_size": 2, "eos_id": eos, "shift": True}
        | ({} if stored is None else {"sees_last": stored}),
        "network": {"_target_": "cdlm.networks.transformer.Transformer"}
        | {"d_model": 16, "n_layers": 1, "n_heads": 2, "max_seq_len": 17}
        | process.network_kwargs,
        "seq_len": 16,
        "labels": [],
    }
    save_model(tmp_path / "m.safetensors", Model(process, network, tok, config))
    loaded = load_model(tmp_path / "m.safetensors")
    assert loaded.process.sees_last is bool(stored)
    assert loaded.denoiser.tail is loaded.process.sees_last
