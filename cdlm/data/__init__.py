"""Data: corpora, tokenizers and the LightningDataModule."""

from cdlm.data.corpus import Document, load_documents
from cdlm.data.datamodule import TextDataModule

__all__ = ["Document", "TextDataModule", "load_documents"]
