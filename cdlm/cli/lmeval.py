"""``cdlm-lm-eval``: lm-evaluation-harness's own command line with ``--model cdlm`` available.

lm-eval 0.4.13 looks models up in its own registry only (no entry points), so its ``lm_eval``
command cannot see cdlm's; this one imports the adapter (``cdlm.evaluation.lmeval``, which
registers it) and hands every argument to lm-eval unchanged (docs/guide/evaluation.md)."""

from __future__ import annotations


def main() -> None:
    from cdlm.evaluation import lmeval  # registers --model cdlm

    lmeval.run_cli()


if __name__ == "__main__":
    main()
