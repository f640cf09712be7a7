"""data=world:<name> (cdlm/worlds/data.py): exact samples of the world, each batch a pure function
of (seed, rank, batch), a finite set that repeats, a validation set shared by every run and rank,
the world's tokenizer only, and a CLI training run whose model file names its world."""

from __future__ import annotations

import copy
from itertools import islice

import pytest
import torch
from conftest import TINY_TRAIN, resumed_batches, train_in_process

from cdlm.configs import compose
from cdlm.data.order import ResumableSampler
from cdlm.model_file import load_model
from cdlm.worlds import load, names
from cdlm.worlds.data import FreshLoader, WorldData

SEQ, BATCH = 12, 4


def data(**options) -> WorldData:
    defaults = {"world": "world:chars", "seq_len": SEQ, "batch_size": BATCH, "val_size": 8}
    dm = WorldData(**defaults | options)
    dm.setup("fit")
    return dm


def batches(dm: WorldData, n: int) -> list[torch.Tensor]:
    return [b["tokens"] for b in islice(dm.train_dataloader(), n)]


def test_the_batches_are_exact_samples_of_the_world():
    world, dm = load("world:chars"), data()
    assert dm.tokenizer.get_vocab() == world.tokenizer.get_vocab() and dm.labels == []
    batch = next(iter(dm.train_dataloader()))
    assert batch["tokens"].shape == (BATCH, SEQ) and batch["tokens"].dtype == torch.long
    assert batch["label"].tolist() == [0] * BATCH
    for tokens in (batch["tokens"], dm.val_set.tokens):
        assert torch.isin(tokens, world.emit).all() and not world.violations(tokens).any()
    assert dm.val_set.tokens.shape == (8, SEQ)
    # the exact unigram: a distribution over the vocabulary, NEVER-low on pad/eos/mask
    prior = dm.log_unigram()
    assert prior.shape == (dm.vocab_size,) and torch.isclose(prior.exp().sum(), torch.tensor(1.0))
    assert prior[dm.tokenizer.mask_token_id] <= -1e4


def test_the_world_length_is_the_default_sequence_length():
    dm = WorldData("world:chars", batch_size=2, val_size=2)
    dm.setup()
    assert dm.seq_len == load("world:chars").length == dm.val_set.tokens.shape[1]


def test_fresh_batches_are_a_function_of_seed_and_batch_index():
    first, again, other = batches(data(), 3), batches(data(), 3), batches(data(seed=1), 3)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not any(torch.equal(a, b) for a, b in zip(first, other, strict=True))
    # fresh: no batch repeats the one before
    assert not torch.equal(first[0], first[1]) and not torch.equal(first[1], first[2])
    # a resumed loader (its checkpointed state) continues the stream exactly
    dm = data()
    loader = dm.train_dataloader()
    state = loader.state_dict() | {"taken": 2}
    loader.load_state_dict(state)
    assert torch.equal(next(iter(loader))["tokens"], first[2])
    # DataLoader workers interleave back into stream order
    workers = FreshLoader(data().train_dataloader().dataset, batch_size=None, num_workers=2)
    assert all(torch.equal(a["tokens"], b) for a, b in zip(islice(workers, 3), first, strict=True))


def test_a_resume_with_other_data_is_refused():
    loader = data().train_dataloader()
    with pytest.raises(ValueError, match="resume with the same data and seed"):
        loader.load_state_dict(data(seed=5).train_dataloader().state_dict())


def test_the_data_module_counts_the_batches_trained_on():
    class Trainer:
        training, world_size, global_rank = True, 1, 0

    dm = data()
    dm.trainer = Trainer()
    loader = dm.train_dataloader()
    for batch in islice(loader, 2):
        dm.on_before_batch_transfer(batch, 0)
    assert loader.state_dict()["taken"] == 2
    dm.teardown("fit")
    assert dm.train_dataloader().state_dict()["taken"] == 0  # a later fit starts afresh


def test_ranks_draw_different_batches_and_share_the_validation_set():
    def on_rank(rank: int) -> WorldData:
        class Trainer:
            training, world_size, global_rank = True, 2, rank

        dm = data()
        dm.trainer = Trainer()
        return dm

    zero, one = on_rank(0), on_rank(1)
    assert not any(
        torch.equal(a, b) for a, b in zip(batches(zero, 3), batches(one, 3), strict=True)
    )
    assert torch.equal(zero.val_set.tokens, one.val_set.tokens)
    # validation: rank r takes batches r, r + 2, ... of the one-process batching
    shards = [list(dm.val_dataloader().sampler) for dm in (zero, one)]
    assert shards == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # the validation set is the world's, not the run's: the same for every seed
    assert torch.equal(data(seed=3).val_set.tokens, zero.val_set.tokens)


def test_a_finite_training_set_repeats_every_epoch():
    dm = data(train_size=8)
    assert len(dm.train_set) == 8 and torch.equal(
        dm.train_set.tokens, data(train_size=8).train_set.tokens
    )
    loader = dm.train_dataloader()
    sampler: ResumableSampler = loader.sampler
    epochs = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        epochs.append(torch.cat([b["tokens"] for b in loader]))
    rows = [sorted(e.tolist()) for e in epochs]
    assert rows[0] == rows[1] == sorted(dm.train_set.tokens.tolist())
    assert not torch.equal(epochs[0], epochs[1])  # each epoch its own shuffle


def test_only_the_worlds_own_tokenizer_is_accepted():
    world = load("world:chars")
    dm = WorldData("world:chars", seq_len=SEQ, batch_size=BATCH, val_size=4)
    twin = copy.deepcopy(world.tokenizer)
    dm.use_tokenizer(twin)
    dm.setup()
    assert dm.tokenizer is twin
    dm = WorldData("world:chars", seq_len=SEQ, batch_size=BATCH, val_size=4)
    dm.use_tokenizer(load("world:agreement").tokenizer)
    with pytest.raises(ValueError, match=r"^data.world=world:chars trains on the world's own"):
        dm.setup()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"world": "chars"}, "unknown data.world 'chars'; valid: world:agreement, world:chars"),
        ({"world": "world:nope"}, "unknown data.world"),
        ({"train_size": 2}, "data.train_size must be an integer >= 4"),
        ({"seq_len": 1}, "data.seq_len must be an integer >= 2"),
    ],
)
def test_bad_options_are_refused_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        WorldData(**{"batch_size": BATCH} | options)


def test_every_world_alias_composes():
    for name in names():  # a new conf/world/ file needs its conf/data/world:<name>.yaml
        cfg = compose("train", [f"data=world:{name}", "process=masked"])
        assert cfg.data.world == f"world:{name}"
        assert cfg.data._target_ == "cdlm.worlds.data.WorldData"


WORLD_TRAIN = [
    "data=world:chars",
    "process=masked",
    *(o for o in TINY_TRAIN if not o.startswith("data.vocab_size")),
    "data.val_size=8",
    "+trainer.enable_progress_bar=false",
]


def test_a_masked_run_on_a_world_records_it_in_the_model(tmp_path, monkeypatch):
    train_in_process(
        monkeypatch,
        *WORLD_TRAIN,
        "callbacks.model_folder.bound_sequences=2",
        f"hydra.run.dir={tmp_path}",
    )
    model = load_model(tmp_path / "model.safetensors")
    assert model.config["world"] == "world:chars" and model.config["labels"] == []
    assert model.config["network"]["num_classes"] == 0  # condition.labels=true: no labels to use
    assert model.tokenizer.get_vocab() == load("world:chars").tokenizer.get_vocab()


@pytest.mark.parametrize("train_size", ["null", "6"])
def test_a_resumed_run_trains_on_the_uninterrupted_batches(train_size, tmp_path, monkeypatch):
    """3 steps, a checkpoint, a resume to 5: steps 3 and 4 get the uninterrupted run's batches
    (fresh samples; a finite set of 3 batches, so the resume starts its second epoch)."""
    run = [
        *WORLD_TRAIN,
        "data.batch_size=2",
        f"data.train_size={train_size}",
        "callbacks.samples.num_samples=0",
        "callbacks.model_folder.bound_sequences=0",
        "callbacks.checkpoint.every_n_train_steps=3",
    ]
    reference = resumed_batches(monkeypatch, run, tmp_path)
    rows = [tuple(row) for step in sorted(reference) for row in reference[step]]
    if train_size == "null":  # fresh: no sequence comes back
        assert len(set(rows)) == len(rows) == 10
    else:  # the second epoch draws from the first's six sequences
        assert len(set(rows[:6])) == 6 and set(rows[6:]) <= set(rows[:6])


def test_a_gaussian_world_model_takes_a_trained_models_embedding_table(tmp_path, monkeypatch):
    """``ckpt=world:chars process=gaussian embedding=PATH``: the oracle diffuses over the
    trained model's own table (the world of that model's noise), not the fixed one."""
    run = [o for o in WORLD_TRAIN if o != "process=masked"] + ["process=gaussian"]
    train_in_process(monkeypatch, *run, "process.embed_dim=8", f"hydra.run.dir={tmp_path}")
    trained = load_model(tmp_path / "model.safetensors")
    process = compose("train", ["process=gaussian"]).process
    oracle = load_model("world:chars", process=process, embedding=str(tmp_path))
    fixed = load_model("world:chars", process=process)
    table = trained.process.embedding.table()
    assert torch.equal(oracle.process.embedding.table(), table)
    assert fixed.process.embedding.table().shape[-1] != table.shape[-1]
