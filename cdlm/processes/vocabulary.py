"""The vocabulary facts a process config leaves null, filled in from a tokenizer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cdlm.processes import fim
from cdlm.processes.support import excluded_ids


def token_ids(process_cfg: Any, tokenizer, held: Sequence[int] = ()) -> dict[str, Any]:
    """The vocabulary facts a process config asks for (its keys left null), from the tokenizer.
    A process that fills in the middle (``fim_rate`` > 0) gets its sentinels, which are added
    to the tokenizer here, so that the vocabulary counts them. A process whose ``excluded`` is
    null (uniform, masked, block: ``cdlm.processes.support``) gets the special ids outside ``held``, the specials the data's rows
    hold (a world's none; text's EOS, which its packing writes); a list given stays."""
    fim_ids = fim.add_tokens(tokenizer) if process_cfg.get("fim_rate") else None
    known = {
        "fim_ids": fim_ids,
        "vocab_size": len(tokenizer),
        "mask_id": tokenizer.mask_token_id,
        "eos_id": tokenizer.eos_token_id,
        "bos_id": tokenizer.eos_token_id,  # the AR baseline starts every sequence at EOS
    }
    if "excluded" in process_cfg and process_cfg.get("excluded") is None:
        known["excluded"] = excluded_ids(tokenizer, held)
    return {k: v for k, v in known.items() if k == "vocab_size" or k in process_cfg}
