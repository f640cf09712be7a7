import gzip

import pytest
import torch

from cdlm.data import TextDataModule, load_documents
from cdlm.data.corpus import BUNDLED, clean_text


def test_bundled_corpus_ships_with_provenance():
    names = sorted(p.name for p in BUNDLED.glob("*.txt.gz"))
    assert len(names) == 6 and "emma.txt.gz" in names
    assert "janeaustenr" in (BUNDLED / "PROVENANCE.md").read_text()
    with gzip.open(BUNDLED / "emma.txt.gz", "rt") as f:
        assert "Emma Woodhouse" in f.read(2000)


def test_clean_text_unwraps_paragraphs():
    assert clean_text("a b\nc\n\n\nd\ne\n") == "a b c\nd e"


def test_folder_corpus_labels_are_file_names(tiny_corpus):
    docs = load_documents(str(tiny_corpus))
    assert [d.label for d in docs] == ["emma", "persuasion"]
    assert load_documents(str(tiny_corpus / "emma.txt"))[0].label == "emma"


def test_missing_path_names_the_problem(tmp_path):
    with pytest.raises(ValueError, match="data.path"):
        load_documents(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="no .txt"):
        load_documents(str(tmp_path))


@pytest.mark.parametrize("packing", [True, False])
def test_datamodule_sequences_and_split(tiny_corpus, packing):
    dm = TextDataModule(
        path=str(tiny_corpus),
        vocab_size=300,
        seq_len=24,
        batch_size=4,
        packing=packing,
        val_fraction=0.1,
    )
    dm.setup()
    tok = dm.tokenizer
    assert dm.vocab_size == 300 and dm.labels == ["emma", "persuasion"]
    assert dm.train_set.tokens.shape[1] == 24 and dm.val_set.tokens.shape[1] == 24
    assert set(dm.train_set.labels.tolist()) == {0, 1}
    if packing:
        assert (dm.train_set.tokens != tok.pad_token_id).all()
    else:  # each row: paragraph, EOS, then only PAD
        row = dm.train_set.tokens[0].tolist()
        if tok.pad_token_id in row:
            first_pad = row.index(tok.pad_token_id)
            assert row[first_pad - 1] == tok.eos_token_id
            assert set(row[first_pad:]) == {tok.pad_token_id}
    batch = next(iter(dm.train_dataloader()))
    assert batch["tokens"].shape == (4, 24) and batch["label"].shape == (4,)
    # deterministic: a second module gives the same split
    again = TextDataModule(
        path=str(tiny_corpus), vocab_size=300, seq_len=24, packing=packing, val_fraction=0.1
    )
    again.setup()
    assert torch.equal(again.val_set.tokens, dm.val_set.tokens)


def test_train_size_is_one_fixed_sample_whatever_the_seed(tiny_corpus):
    """data.train_size: that many of the training sequences, the same rows for every run seed,
    the validation split untouched; a size beyond the training set is refused."""
    full, *capped = (
        TextDataModule(
            path=str(tiny_corpus), vocab_size=300, seq_len=24, seed=seed, train_size=size
        )
        for seed, size in ((0, None), (0, 7), (3, 7))
    )
    for dm in (full, *capped):
        dm.setup()
    rows = {tuple(r) for r in full.train_set.tokens.tolist()}
    assert len(capped[0].train_set) == 7 and torch.equal(*(c.train_set.tokens for c in capped))
    assert {tuple(r) for r in capped[0].train_set.tokens.tolist()} <= rows
    assert len({tuple(r) for r in capped[0].train_set.tokens.tolist()}) == 7
    assert torch.equal(capped[0].val_set.tokens, full.val_set.tokens)
    too_many = TextDataModule(path=str(tiny_corpus), vocab_size=300, seq_len=24, train_size=10**6)
    with pytest.raises(ValueError, match=r"data.train_size must be in \[1, \d+\], got 1000000"):
        too_many.setup()
    with pytest.raises(ValueError, match="not with streaming"):
        TextDataModule(path="x", streaming=True, train_size=7)


def test_tokenizer_round_trips_and_is_cached(tiny_corpus):
    dm = TextDataModule(path=str(tiny_corpus), vocab_size=300)
    dm.setup()
    text = "Emma Woodhouse, handsome, clever, and rich"
    assert dm.tokenizer.decode(dm.tokenizer(text)["input_ids"]) == text
    assert {"<pad>", "<eos>", "<mask>"} <= set(dm.tokenizer.get_vocab())


def test_too_small_corpus_is_refused(tmp_path):
    (tmp_path / "a.txt").write_text("one short line")
    dm = TextDataModule(path=str(tmp_path), vocab_size=270, seq_len=64)
    with pytest.raises(ValueError, match="corpus too small"):
        dm.setup()
