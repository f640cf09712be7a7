"""Fixed-length token sequences in memory, each with a label: what the text and world data
modules hand their loaders."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset


class SequenceDataset(Dataset):
    """tokens: (N, L) int64; labels: (N,) int64; pad_id: with padded (unpacked) data, PAD
    positions get ``valid`` False, so that losses and bits/token skip them (as MDLM does);
    prompt: (N, L) bool, the positions each row conditions on (``cdlm.processes.prompts``), or
    None."""

    def __init__(
        self,
        tokens: torch.Tensor,
        labels: torch.Tensor,
        pad_id: int | None = None,
        prompt: torch.Tensor | None = None,
    ) -> None:
        self.tokens, self.labels, self.pad_id, self.prompt = tokens, labels, pad_id, prompt

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        item = {"tokens": self.tokens[i], "label": self.labels[i]}
        if self.pad_id is not None:
            item["valid"] = self.tokens[i] != self.pad_id
        if self.prompt is not None:
            item["prompt"] = self.prompt[i]
        return item

    def counted_tokens(self) -> torch.Tensor:
        """The ids that are text, not PAD (the unigram prior's counts)."""
        return (
            self.tokens.flatten()
            if self.pad_id is None
            else self.tokens[self.tokens != self.pad_id]
        )
