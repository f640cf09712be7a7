"""scripts/decode_overhead.py on a toy shape: every loop and its bare loop run, and the bare
loops make the calls their loops make where those are fixed (AR: one per token)."""

from conftest import experiment_module

overhead = experiment_module("decode_overhead", "scripts")
TINY = overhead.Shape(vocab=24, seq_len=8, d_model=16, n_layers=1, n_heads=2, masked_block=4,
                      masked_steps=4)  # fmt: skip


def test_every_loop_times_against_its_bare_loop():
    rows = [overhead.measure(loop, 2, TINY, repeats=1) for loop in overhead.loops(TINY)]
    assert [r["loop"] for r in rows] == [loop.name for loop in overhead.loops(TINY)]
    for row in rows:
        assert row["loop_over_bare"] > 0 and row["batch"] == 2
        assert row["loop_seconds"]["min"] <= row["loop_seconds"]["median"]
    ar = rows[0]
    assert ar["loop_calls"] == ar["bare_calls"] == TINY.seq_len
    whole = next(r for r in rows if r["loop"] == "ancestral")
    assert whole["loop_calls"] == whole["bare_calls"] == TINY.masked_steps
    assert overhead.markdown(rows).count("\n") == len(rows) + 2
