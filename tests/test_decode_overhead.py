"""scripts/decode_overhead.py on a toy shape: every loop and its bare loop run, and the bare
loops make the calls their loops make where those are fixed (AR: one per token)."""

import json

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


def test_the_gpu_decode_check_runs_on_the_cpu(tmp_path, monkeypatch):
    """scripts/gpu_decode.py (the device check) end to end on a toy shape on the CPU: the AR
    rows (the graph's skipped, saying so; the fixed step's tokens are the growing cache's), the
    block rows, the block batch-1 repeats before and after AR, a profile, and its summary."""
    decode = experiment_module("gpu_decode", "scripts")
    check = experiment_module("gpu_check", "scripts")
    monkeypatch.setattr(decode, "Shape", lambda seq_len: overhead.Shape(
        vocab=24, seq_len=seq_len, d_model=16, n_layers=1, n_heads=2))  # fmt: skip
    out = tmp_path / "decode.json"
    argv = ["gpu_decode", "--out", str(out), "--seq-len", "8", "--repeats", "1"]
    monkeypatch.setattr("sys.argv", [*argv, "--block-repeats", "2", "--batches", "1", "2"])
    decode.main()
    found = json.loads(out.read_text())
    rows = {(r["row"], r["batch"]): r for r in found["rows"]}
    assert rows[("AR, CUDA graph", 2)]["skipped"] == "no CUDA"
    assert rows[("AR, fixed shape", 1)]["nfe"] == 8 and "tokens" not in rows[("AR, fixed shape", 1)]
    assert found["same_tokens"]["autoregressive (random) b2"]["AR, fixed shape"] is True
    assert [r["when"] for r in found["block_batch1"]] == ["before AR"] * 2 + ["after AR"] * 2
    assert found["profiles"][0]["by_self_cpu"] and found["meta"]["device"] == "cpu"
    (tmp_path / "steps.tsv").write_text("decode\t0\t9\n")
    assert "outlier recurred: " in check.figures(tmp_path, "decode")
