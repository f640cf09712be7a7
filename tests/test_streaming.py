"""data.streaming=true (docs/guide/streaming.md): every sequence reaches exactly one worker and rank, a
resumed loader continues the uninterrupted stream, a streamed training run works end to end,
and bad input is refused by name. All local: jsonl files and a word-level tokenizer.

Every document is a run of distinct words ``wK`` (token id K + 4) whose token count, with an EOS
after each paragraph, is a multiple of ``SEQ``, so packing cuts no document across sequences and
the expected sequences can be written down without the code under test.
"""

from __future__ import annotations

import json
from collections import Counter
from itertools import islice
from pathlib import Path

import pytest
import torch
from conftest import TINY_TRAIN, resumed_batches, train_in_process
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from cdlm import config_dir
from cdlm.data import TextDataModule
from cdlm.data.streaming import PackedStream, StreamCorpus, StreamLoader, held_out

SEQ = 8
VAL = 0.1  # of the 24 documents, the hash sends 5 (9 sequences) to validation
SPECIALS = ["<pad>", "<eos>", "<mask>", "<unk>"]
EOS = 1


def documents() -> list[list[list[int]]]:
    """24 documents as paragraphs of word numbers: odd ones fill two sequences in two
    paragraphs, even ones one sequence."""
    docs, word = [], 0
    for d in range(24):
        sizes = [5, 9] if d % 2 else [7]  # + 1 EOS each: 16 or 8 tokens
        doc = []
        for size in sizes:
            doc.append(list(range(word, word + size)))
            word += size
        docs.append(doc)
    return docs


def text(doc: list[list[int]]) -> str:
    return "\n\n".join(" ".join(f"w{k}" for k in p) for p in doc)


def expected_sequences(validation: bool = False) -> Counter:
    rows = Counter()
    for doc in documents():
        if held_out(text(doc), VAL) == validation:
            ids = [i for p in doc for i in [*(k + len(SPECIALS) for k in p), EOS]]
            rows.update(tuple(ids[k : k + SEQ]) for k in range(0, len(ids), SEQ))
    return rows


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models train faster on one thread, above all on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Three jsonl files of 8 documents each."""
    folder = tmp_path_factory.mktemp("jsonl")
    docs = documents()
    for f in range(3):
        with open(folder / f"part-{f}.jsonl", "w") as out:
            for doc in docs[8 * f : 8 * f + 8]:
                out.write(json.dumps({"text": text(doc), "id": len(doc)}) + "\n")
    return folder


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    vocab = {t: i for i, t in enumerate(SPECIALS)} | {f"w{k}": k + 4 for k in range(400)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    folder = tmp_path_factory.mktemp("tokenizer")
    PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<eos>",
        mask_token="<mask>",
        unk_token="<unk>",
    ).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)


def stream(corpus: Path, tokenizer, **options) -> PackedStream:
    source = StreamCorpus(str(corpus), val_fraction=VAL, shuffle_buffer=4, seed=3)
    return PackedStream(source, tokenizer, SEQ, batch_size=2, **options)


def rows(batches) -> list[tuple[int, ...]]:
    return [tuple(r) for b in batches for r in b["tokens"].tolist()]


def test_the_fixture_holds_out_some_documents_and_trains_on_the_rest():
    assert 0 < sum(expected_sequences(validation=True).values()) < 10


def test_two_workers_see_every_training_sequence_once(corpus, tokenizer):
    loader = StreamLoader(stream(corpus, tokenizer, passes=1), batch_size=2, num_workers=2)
    assert Counter(rows(loader)) == expected_sequences()


@pytest.mark.parametrize("world", [2, 3])  # 2: every other document; 3: a file per rank
def test_ranks_split_the_stream_disjointly_and_completely(corpus, tokenizer, world):
    whole = stream(corpus, tokenizer, passes=1)
    parts = [Counter(rows(StreamLoader(whole.shard(r, world), batch_size=2))) for r in range(world)]
    assert all(parts) and sum(parts, Counter()) == expected_sequences()
    assert all(not parts[a] & parts[b] for a in range(world) for b in range(a))


@pytest.mark.parametrize("workers, k", [(0, 5), (2, 3), (2, 4)])
def test_a_resumed_loader_continues_the_uninterrupted_stream(corpus, tokenizer, workers, k):
    """Past the end of a pass, too: 16 batches of 2 are more than the 27 training sequences."""
    reference = rows(islice(StreamLoader(stream(corpus, tokenizer), 2, num_workers=workers), 16))
    first = StreamLoader(stream(corpus, tokenizer), batch_size=2, num_workers=workers)
    for batch in islice(first, k):  # as TextDataModule.on_before_batch_transfer counts
        first.dataset.taken += len(batch["tokens"])
    state = first.state_dict()
    resumed = StreamLoader(stream(corpus, tokenizer), batch_size=2, num_workers=workers)
    resumed.load_state_dict(state)
    assert rows(islice(resumed, 16 - k)) == reference[2 * k :]
    other = StreamLoader(stream(corpus, tokenizer), batch_size=2, num_workers=workers + 2)
    with pytest.raises(ValueError, match="data.num_workers"):
        other.load_state_dict(state)


def test_datamodule_holds_out_whole_documents_and_has_no_labels(corpus, tokenizer_dir):
    dm = TextDataModule(
        path=str(corpus),
        tokenizer=str(tokenizer_dir),
        seq_len=SEQ,
        batch_size=2,
        val_fraction=VAL,
        streaming=True,
        val_sequences=3,
        sample_documents=5,
    )
    dm.setup("fit")
    assert dm.labels == [] and dm.vocab_size == 404 and not hasattr(dm.train_set, "__len__")
    val = Counter(tuple(r) for r in dm.val_set.tokens.tolist())
    assert dm.val_set.tokens.shape == (3, SEQ) and val <= expected_sequences(validation=True)
    batch = next(iter(dm.train_dataloader()))
    assert batch["tokens"].shape == (2, SEQ) and batch["label"].tolist() == [0, 0]
    prior = dm.log_unigram()
    assert prior.shape == (404,) and torch.allclose(prior.exp().sum(), torch.tensor(1.0))


def test_without_a_tokenizer_the_corpus_bpe_is_trained_on_the_first_documents(corpus):
    dm = TextDataModule(
        path=str(corpus), vocab_size=300, seq_len=SEQ, val_fraction=VAL, streaming=True
    )
    dm.setup("fit")
    assert dm.vocab_size == 300 and dm.tokenizer.decode(dm.tokenizer("w1 w2")["input_ids"]) == (
        "w1 w2"
    )


@pytest.mark.parametrize(
    "options, message",
    [
        ({"path": "/no/such/folder"}, "data.path='/no/such/folder' does not exist"),
        ({"path": None}, "data.streaming=true needs data.path"),
        ({"packing": False}, "data.packing=false is not supported"),
        ({"text_column": "body"}, "data.text_column='body' is not a column"),
        ({"val_sequences": 0}, "data.val_sequences must be an integer >= 1"),
    ],
)
def test_bad_streaming_input_names_the_key(corpus, tokenizer_dir, options, message):
    kwargs = {"path": str(corpus), "tokenizer": str(tokenizer_dir), "seq_len": SEQ}
    dm = TextDataModule(**(kwargs | options), streaming=True)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        dm.setup("fit")


def test_a_folder_without_streamable_files_is_refused(tmp_path, tokenizer_dir):
    (tmp_path / "a.txt").write_text("text")
    dm = TextDataModule(path=str(tmp_path), tokenizer=str(tokenizer_dir), streaming=True)
    with pytest.raises(ValueError, match="has no streamable files: give .json, .jsonl"):
        dm.setup()


def test_the_cli_refuses_a_missing_streaming_path_in_one_line(tmp_path, monkeypatch, capsys):
    missing = tmp_path / "nope"
    with pytest.raises(SystemExit) as exit_:
        train_in_process(
            monkeypatch, "data.streaming=true", f"data.path={missing}", f"hydra.run.dir={tmp_path}"
        )
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("cdlm-train: error: data.path="), err
    assert "does not exist" in err and "Traceback" not in err


def test_a_streamed_training_run_writes_a_model(corpus, tokenizer_dir, tmp_path, monkeypatch):
    train_in_process(
        monkeypatch,
        *TINY_TRAIN,
        "data.streaming=true",
        f"data.path={corpus}",
        f"data.tokenizer={tokenizer_dir}",
        f"data.seq_len={SEQ}",
        f"data.val_fraction={VAL}",
        "data.num_workers=2",
        "data.shuffle_buffer=4",
        "trainer.max_steps=2",
        "trainer.val_check_interval=2",
        "callbacks.model_folder.bound_sequences=2",
        "+trainer.enable_progress_bar=false",
        f"hydra.run.dir={tmp_path}",
    )
    assert (tmp_path / "model.safetensors").is_file()
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["labels"] == [] and config["seq_len"] == SEQ


@pytest.mark.slow  # three CLI trainings; run by .ci/run's slow pass
def test_a_resumed_streamed_run_trains_on_the_uninterrupted_batches(
    corpus, tokenizer_dir, tmp_path, monkeypatch
):
    """3 steps, a checkpoint, a resume to 5: steps 3 and 4 get the uninterrupted run's batches
    (3 batches taken by 2 workers: the resumed workers swap roles)."""
    run = [
        *TINY_TRAIN,
        "data.streaming=true",
        f"data.path={corpus}",
        f"data.tokenizer={tokenizer_dir}",
        f"data.seq_len={SEQ}",
        "data.batch_size=2",
        f"data.val_fraction={VAL}",
        "data.num_workers=2",
        "callbacks.samples.num_samples=0",
        "callbacks.model_folder.bound_sequences=0",
        "callbacks.checkpoint.every_n_train_steps=3",
        "+trainer.enable_progress_bar=false",
    ]
    resumed_batches(monkeypatch, run, tmp_path)


@pytest.mark.parametrize(
    "name, path", [("fineweb", "HuggingFaceFW/fineweb"), ("openwebtext", "Skylion007/openwebtext")]
)
def test_hub_configs_stream_with_gpt2(name, path):
    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        cfg = compose("train", overrides=[f"data={name}"])
    assert cfg.data.path == path and cfg.data.streaming and cfg.data.tokenizer == "gpt2"
    assert cfg.data.seq_len == 1024
    dm = instantiate(cfg.data, seed=0)  # builds nothing until setup: no download here
    assert dm.streaming and dm.train_set is None
    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        assert compose("train").data.streaming is False
