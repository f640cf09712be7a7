"""Where text comes from: the bundled Austen corpus, the user's .txt files, or HF datasets.

Every source yields ``Document``s (text plus a label). For files, the label is the file name
without extension, so the bundled novels are labelled by novel. Prose is unwrapped into one line
per paragraph; source code (``.py``) keeps its lines and indentation, so that EOS (the line break
of every model here) ends each line of code.
"""

from __future__ import annotations

import gzip
import re
from dataclasses import dataclass
from pathlib import Path

BUNDLED = Path(__file__).parent / "austen"
TEXT_SUFFIXES = (".txt", ".txt.gz")
CODE_SUFFIXES = (".py",)


@dataclass
class Document:
    text: str
    label: str


def clean_text(raw: str) -> str:
    """Unwraps printed line breaks: paragraphs (blank-line separated) become single lines."""
    paragraphs = (re.sub(r"\s*\n\s*", " ", p).strip() for p in re.split(r"\n\s*\n", raw))
    return "\n".join(p for p in paragraphs if p)


def code_text(raw: str) -> str:
    """Source code line by line: indentation kept, trailing spaces and blank lines dropped."""
    return "\n".join(line.rstrip() for line in raw.splitlines() if line.strip())


def _read(path: Path) -> str:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text (byte {e.start}); convert it first") from None
    except (OSError, EOFError) as e:  # e.g. a truncated or fake .gz
        raise ValueError(f"{path} cannot be read: {e}") from None


def _label(path: Path) -> str:
    name = path.name
    for suffix in TEXT_SUFFIXES + CODE_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def _text_files(folder: Path) -> list[Path]:
    suffixes = TEXT_SUFFIXES + CODE_SUFFIXES
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name.endswith(suffixes))


def load_documents(
    path: str | None = None,
    text_column: str = "text",
    label_column: str | None = None,
    split: str = "train",
) -> list[Document]:
    """Reads a corpus.

    Args:
        path: None for the bundled Austen novels; a .txt/.txt.gz/.py file; a folder of them (searched
            recursively); or else the name/path of a Hugging Face dataset (needs ``datasets``).
        text_column, label_column, split: used for HF datasets only.
    """
    if path is None:
        files = _text_files(BUNDLED)
    else:
        p = Path(path).expanduser()
        if p.is_file():
            files = [p]
        elif p.is_dir():
            files = _text_files(p)
            if not files:
                raise ValueError(
                    f"data.path={path!r} is a folder with no .txt, .txt.gz or .py files"
                )
        else:
            return _load_hf(path, text_column, label_column, split)
    docs = [Document(_clean(f)(_read(f)), _label(f)) for f in files]
    if not any(d.text for d in docs):
        raise ValueError(f"data.path={path!r} holds no text")
    return docs


def _clean(path: Path):
    return code_text if path.name.endswith(CODE_SUFFIXES) else clean_text


def _load_hf(name: str, text_column: str, label_column: str | None, split: str) -> list[Document]:
    try:
        import datasets
    except ImportError:
        raise ValueError(
            f"data.path={name!r} is neither a file nor a folder, and the `datasets` package "
            "(needed for Hugging Face dataset names) is not installed"
        ) from None
    try:
        rows = datasets.load_dataset(name, split=split)
    except (FileNotFoundError, ConnectionError) as e:  # DatasetNotFoundError, or offline
        raise ValueError(
            f"data.path={name!r} is not a file, a folder or a reachable dataset: {e}"
        ) from None
    if text_column not in rows.column_names:
        raise ValueError(f"dataset {name!r} has no column {text_column!r}: {rows.column_names}")
    labels = rows[label_column] if label_column else ["all"] * len(rows)
    return [
        Document(clean_text(t), str(lab)) for t, lab in zip(rows[text_column], labels, strict=False)
    ]
