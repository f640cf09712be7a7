"""Hugging Face model folders: the run folder is one, save_pretrained / from_pretrained round
trips give identical samples, AutoTokenizer loads the tokenizer, the card lists measured
figures, the CLIs take a folder, and the Hub is reached only through HfApi / snapshot_download
(mocked here: these tests never go online)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import draw, run_main
from transformers import AutoTokenizer

import cdlm
from cdlm import hub
from cdlm.model_file import ModelFileError, load_model


def samples(model, seed: int = 3) -> list[list[int]]:
    gen = draw(model, steps=4, num_samples=3, seed=seed)
    return [s.token_ids for s in gen.samples]


@pytest.mark.parametrize("fixture", ["tiny_checkpoint", "tiny_masked_checkpoint"])
def test_save_pretrained_from_pretrained_gives_identical_samples(fixture, request, tmp_path):
    trained = load_model(request.getfixturevalue(fixture))
    folder = trained.save_pretrained(tmp_path / "model")
    assert {p.name for p in folder.iterdir()} >= {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "README.md",
    }
    loaded = cdlm.from_pretrained(folder)
    for a, b in ((trained.process, loaded.process), (trained.network, loaded.network)):
        for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
            assert ka == kb and torch.equal(va, vb)
    assert samples(trained) == samples(loaded)
    # the weights file inside stays a complete model on its own
    assert samples(load_model(folder / "model.safetensors")) == samples(trained)


def test_auto_tokenizer_loads_the_folder_tokenizer(tiny_masked_checkpoint, tmp_path):
    model = load_model(tiny_masked_checkpoint)
    folder = model.save_pretrained(tmp_path / "m")
    tok = AutoTokenizer.from_pretrained(folder)
    text = "It is a truth universally acknowledged."
    assert tok(text)["input_ids"] == model.tokenizer(text)["input_ids"]
    assert (tok.eos_token, tok.mask_token, tok.pad_token) == ("<eos>", "<mask>", "<pad>")
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    assert settings["tokenizer_class"] == "PreTrainedTokenizerFast"  # any transformers version


def test_cdlm_train_makes_the_run_folder_a_model_folder(tiny_checkpoint):
    folder = tiny_checkpoint.parent
    config = json.loads((folder / "config.json").read_text())
    facts = config["card"]
    assert facts["process"] == "gaussian" and facts["parameters"] > 0
    assert facts["training"]["steps"] == 3
    assert facts["training"]["tokens"] == 3 * 4 * 16  # steps x batch x length
    assert facts["training"]["command"].startswith("cdlm-train data.path=")
    bound = facts["metrics"]["bits_per_token"]
    assert 0 < bound < 20
    card = (folder / "README.md").read_text()
    assert "library_name: cdlm" in card and "GaussianProcess(" in card
    assert f"cdlm-sample ckpt={folder}" in card
    assert f"| val bound (bits/token) | {bound:.3f} |" in card
    assert "| training tokens | 192 (3 steps of 64 tokens) |" in card
    assert "gen-PPL | - | not measured yet: `cdlm-eval" in card


def test_recorded_metrics_reach_the_card(tiny_masked_checkpoint, tmp_path):
    folder = load_model(tiny_masked_checkpoint).save_pretrained(tmp_path / "m")
    metrics = {"bits_per_token": 5.25, "bound_how": "ELBO", "gen_ppl": 123.4, "gen_ppl_how": "x"}
    assert hub.record_metrics(folder, metrics | {"token_entropy_bits": 7.5, "source": "test"})
    card = (folder / "README.md").read_text()
    assert "| val bound (bits/token) | 5.250 | ELBO |" in card
    assert "| gen-PPL | 123.4 | x |" in card and "| token entropy (bits) | 7.500 | x |" in card
    assert cdlm.from_pretrained(folder).facts["metrics"]["gen_ppl"] == 123.4
    assert not hub.record_metrics(tmp_path, metrics)  # a folder without config.json


def test_cli_sample_and_eval_take_a_folder(tiny_masked_checkpoint, tmp_path):
    folder = load_model(tiny_masked_checkpoint).save_pretrained(tmp_path / "m")
    result = run_main("cdlm-sample", f"ckpt={folder}", "steps=2", "num_samples=1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    args = (f"ckpt={folder}", "scorer=none", "wandb=false", "num_samples=2", "steps=2")
    result = run_main("cdlm-eval", *args, "repeats=1", "num_batches=1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"the report goes to {folder / 'eval.json'}" in result.stderr
    report = json.loads((folder / "eval.json").read_text())
    card = (folder / "README.md").read_text()
    assert f"{report['likelihood']['bits_per_token']:.3f}" in card
    assert "Measured by `cdlm-eval ckpt=" in card


def test_a_folder_without_weights_is_named(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelFileError, match="folder without model.safetensors"):
        load_model(tmp_path)


class FakeApi:
    """Stands in for huggingface_hub.HfApi: records what would be sent."""

    calls: list = []

    def __init__(self, token=None) -> None:
        self.token = token

    def create_repo(self, repo_id, private=False, exist_ok=False):
        FakeApi.calls.append(("create_repo", repo_id, private, exist_ok))

    def create_commit(self, repo_id, operations, commit_message, revision=None):
        FakeApi.calls.append(("create_commit", repo_id, operations))
        return type("Info", (), {"commit_url": f"https://hub.example/{repo_id}/commit/1"})()


def test_push_to_hub_sends_the_hub_files_through_hfapi(tiny_checkpoint, monkeypatch):
    monkeypatch.setattr(hub, "HfApi", FakeApi)
    FakeApi.calls = []
    url = hub.push_folder(tiny_checkpoint.parent, "someone/tiny", token="t")
    assert url.endswith("someone/tiny/commit/1")
    (_, repo, private, exist_ok), (_, _, operations) = FakeApi.calls
    assert (repo, private, exist_ok) == ("someone/tiny", False, True)
    sent = {op.path_in_repo: op for op in operations}
    # the run folder also holds Lightning checkpoints and logs: only the Hub files go
    assert set(sent) == {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "README.md",
    }
    card = sent["README.md"].path_or_fileobj
    card = card.read() if hasattr(card, "read") else card
    assert b"cdlm-sample ckpt=someone/tiny" in card


def test_model_push_to_hub_writes_then_sends(tiny_masked_checkpoint, monkeypatch):
    monkeypatch.setattr(hub, "HfApi", FakeApi)
    FakeApi.calls = []
    load_model(tiny_masked_checkpoint).push_to_hub("someone/m", private=True)
    assert FakeApi.calls[0] == ("create_repo", "someone/m", True, True)
    assert len(FakeApi.calls[1][2]) == 5


def test_hub_ids_download_only_the_hub_files(tiny_masked_checkpoint, tmp_path, monkeypatch):
    import huggingface_hub

    folder = load_model(tiny_masked_checkpoint).save_pretrained(tmp_path / "cache")
    asked = {}

    def snapshot_download(repo_id, revision=None, allow_patterns=None):
        asked.update(repo_id=repo_id, revision=revision, allow_patterns=allow_patterns)
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    model = cdlm.from_pretrained("someone/tiny-masked", revision="v1")
    assert asked["repo_id"] == "someone/tiny-masked" and asked["revision"] == "v1"
    assert not any(p.endswith((".bin", ".pt", ".ckpt", ".pkl")) for p in asked["allow_patterns"])
    assert model.process.kind == "masked"


def test_an_unreachable_hub_id_gets_one_message(monkeypatch, tmp_path):
    import huggingface_hub

    def offline(*args, **kwargs):
        raise OSError("no network")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelFileError, match="not a local path, and the Hugging Face Hub"):
        cdlm.from_pretrained("nobody/nothing")
    assert not hub.is_hub_id("run/model.safetensors")  # a missing file stays a missing file
    assert not hub.is_hub_id(str(Path(tmp_path)))
