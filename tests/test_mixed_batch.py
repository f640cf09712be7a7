"""Batches of different prompts (``cdlm.generation.rows``): every row of a mixed batch (prompts
of different lengths, an infill template) comes out token for token as it does sampled alone
with its own seed (``member_seed(seed, row)``), for each process, its default sampler and a few others.

The networks run in float32: a batch and a row alone run matmuls of different shapes (and the
padded batch a masked attention), which could differ in the last bit, but no draw flipped here;
padding that leaks into attention does flip them (``wake``)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import run_main, train_tiny

from cdlm.generation import Plan, default_sampler, generate, named_sampler, with_cache
from cdlm.generation.inputs import Row, read_layout
from cdlm.generation.rows import generate_rows
from cdlm.guidance import Guidance
from cdlm.model_file import load_model
from cdlm.rng import member_seed
from cdlm.samplers.blockwise import DualCache, PrefixCache

ROWS = [
    Row(prompt="the", max_new_tokens=6),
    Row(prompt="it was a long time", max_new_tokens=3),
    Row(prompt="she said that"),
    Row(infill="the [[3]] of [[2]] and"),
]

PROCESSES = {
    "ar": ("process=autoregressive",),
    "masked": ("process=masked",),
    "block": ("process=block", "process.block_size=4"),
    "gaussian": ("process.embed_dim=8",),
    "uniform": ("process=uniform",),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_corpus):
    cache = {}

    def get(kind: str):
        if kind not in cache:
            model = load_model(train_tiny(tmp_path_factory, tiny_corpus, *PROCESSES[kind]))
            wake(model.network)
            cache[kind] = model
        return cache[kind]

    return get


def wake(network) -> None:
    """Random adaLN gates: a 3-step model's blocks are still nearly the identity (adaLN-Zero),
    so its positions barely read one another and padding that leaked into attention would not
    show; with open gates it changes the samples (checked: without ``Unpadded`` rows differ)."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in network.named_parameters():
            if "ada" in name:
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)


def alone(model, sampler, row: Row, seed: int, steps: int, scale: float = 1.0) -> list[int]:
    layout = read_layout(
        model, 16, prompt=row.prompt, infill=row.infill, max_new_tokens=row.max_new_tokens
    )
    n = len(layout.ids)  # the whole canvas, as a row comes back
    guidance = Guidance(scale=scale, on="prompt")
    plan = Plan(1, n, steps, seed, layout=layout, guidance=guidance, cut_at_eos=False)
    return generate(model, sampler, plan).samples[0].token_ids


# (process, sampler and its options; None: the process's default).
CASES = [
    ("ar", None, {}),
    ("masked", None, {}),
    ("masked", "threshold", {}),
    ("masked", "confidence", {}),
    ("masked", "ancestral", {"block_length": 4}),
    ("masked", "ancestral", {"block_length": 4, "cache": "prefix"}),
    ("masked", "threshold", {"block_length": 4, "cache": "dual"}),
    ("block", None, {}),
    ("block", "block", {"steps_per_block": 2}),
    ("gaussian", None, {}),
    ("gaussian", "ddpm", {}),
    ("uniform", None, {}),
]


@pytest.mark.parametrize(("kind", "name", "options"), CASES)
def test_a_row_in_a_mixed_batch_is_the_row_alone(models, kind, name, options):
    model = models(kind)
    options = dict(options)
    cache = {"prefix": PrefixCache, "dual": DualCache}.get(options.pop("cache", None))
    sampler = named_sampler(name, **options) if name else default_sampler(model.process)
    if cache is not None:  # Fast-dLLM's approximate caches: padded keys recorded as such
        sampler = with_cache(sampler, cache())
    rows = ROWS[:3] if kind == "ar" else ROWS  # a causal model without FIM takes prompts only
    plan = Plan(num_samples=1, seq_len=16, steps=8, seed=5, batch_size=None)
    mixed = generate_rows(model, sampler, plan, rows)
    assert len({len(r.token_ids) for r in mixed.rows}) > 1  # the canvases differ in length
    for i, row in enumerate(rows):
        assert mixed.rows[i].seed == member_seed(5, i)
        got = mixed.rows[i].token_ids
        assert got == alone(model, sampler, row, member_seed(5, i), 8), (kind, name, i)


@pytest.mark.parametrize("kind", ["masked", "gaussian"])
def test_sets_drawn_with_neighbouring_seeds_share_no_sample(models, kind):
    """A set of one prompt's samples (as ``cdlm-eval prompt=`` draws it) with seed 1 is not
    seed 0's set shifted by one (``seed + i`` made it so): no seed and no sample in common."""
    model = models(kind)
    sampler, row = default_sampler(model.process), Row(prompt="the", max_new_tokens=12)
    sets = [generate_rows(model, sampler, Plan(6, 16, 8, seed), [row]).rows for seed in (0, 1)]
    assert not {r.seed for r in sets[0]} & {r.seed for r in sets[1]}
    samples = [{tuple(r.token_ids) for r in rows} for rows in sets]
    assert len(samples[0]) == len(samples[1]) == 6  # six different samples in each set
    assert not samples[0] & samples[1]


@pytest.mark.parametrize("kind", ["masked", "gaussian"])
@pytest.mark.parametrize("scale", [0.0, 2.0])
def test_a_guided_row_in_a_mixed_batch_is_the_row_alone(models, kind, scale):
    """Prompt guidance on rows: each row of a padded batch, guided on its own fixed text, is the
    row guided alone (its blanks from its own ``rng.blanks_generator``; the unconditional half sees the padding
    hidden too), and guidance changes what is drawn."""
    model = models(kind)
    sampler = default_sampler(model.process)
    plan = Plan(1, 16, 8, 5, guidance=Guidance(scale=scale, on="prompt"))
    mixed = generate_rows(model, sampler, plan, ROWS)
    plain = generate_rows(model, sampler, Plan(1, 16, 8, 5), ROWS)
    assert mixed.nfe == plain.nfe * (2 if scale == 2.0 else 1)
    assert [r.token_ids for r in mixed.rows] != [r.token_ids for r in plain.rows]
    for i, row in enumerate(ROWS):
        got = mixed.rows[i].token_ids
        assert got == alone(model, sampler, row, member_seed(5, i), 8, scale), (kind, scale, i)


def test_rows_refuse_a_label_and_ar_prompt_guidance(models):
    plan = Plan(1, 16, 4, 0, guidance=Guidance(label=0, scale=2.0, on="label"))
    with pytest.raises(ValueError, match="not on a label"):
        generate_rows(models("masked"), default_sampler(models("masked").process), plan, ROWS)
    ar = models("ar")
    plan = Plan(1, 16, 4, 0, guidance=Guidance(scale=2.0, on="prompt"))
    with pytest.raises(ValueError, match="prompt guidance needs a process"):
        generate_rows(ar, default_sampler(ar.process), plan, ROWS[:3])


def write_rows(path, lines: list[str]):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def one_line_error(result, *needles):
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(lines) == 1 and all(n in lines[0] for n in needles), lines


def test_cli_samples_a_prompts_file(tiny_masked_checkpoint, tmp_path):
    """cdlm-sample prompts=FILE: num_samples records per line, in order, each the row drawn
    alone with ``member_seed(seed, index)``, its fixed text kept, in batches of batch_size rows."""
    lines = [json.dumps(row.__dict__) for row in ROWS]
    path = write_rows(tmp_path / "rows.jsonl", lines)
    out = tmp_path / "s.jsonl"
    args = [f"ckpt={tiny_masked_checkpoint}", f"prompts={path}", "steps=4", "progress=false"]
    result = run_main(
        "cdlm-sample", *args, "num_samples=2", "batch_size=3", "seed=3", f"out={out}", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-2000:]
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["line"] for r in got] == [1, 1, 2, 2, 3, 3, 4, 4]
    assert [r["seed"] for r in got] == [member_seed(3, r) for r in range(8)]
    model = load_model(tiny_masked_checkpoint)
    sampler = default_sampler(model.process)
    for r in got:
        row = ROWS[r["line"] - 1]
        assert r["token_ids"] == alone(model, sampler, row, r["seed"], 4)
        assert r["regions"][0]["text"] == (row.prompt or "the ")
    assert got[0]["text"].startswith("the") and got[6]["text"].endswith(" and")


def test_cli_guides_a_prompts_file_at_each_scale(tiny_masked_checkpoint, tmp_path):
    """prompts= with guidance.scale=[0,2]: the file at each scale, records numbered on across
    scales, each line with the same seed at both, each record its row guided alone."""
    lines = [json.dumps(row.__dict__) for row in ROWS]
    path = write_rows(tmp_path / "rows.jsonl", lines)
    out = tmp_path / "s.jsonl"
    args = [f"ckpt={tiny_masked_checkpoint}", f"prompts={path}", "steps=4", "progress=false"]
    scales = "guidance.scale=[0,2]"
    result = run_main(
        "cdlm-sample", *args, scales, "num_samples=1", "seed=3", f"out={out}", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-2000:]
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["index"] for r in got] == list(range(8))
    assert [r["scale"] for r in got] == [0.0] * 4 + [2.0] * 4
    assert {r["guidance_on"] for r in got} == {"prompt"}
    assert [r["seed"] for r in got] == [member_seed(3, r) for r in range(4)] * 2
    model = load_model(tiny_masked_checkpoint)
    sampler = default_sampler(model.process)
    for r in got:
        row = ROWS[r["line"] - 1]
        assert r["token_ids"] == alone(model, sampler, row, r["seed"], 4, r["scale"])


@pytest.mark.parametrize(
    ("lines", "needles"),
    [
        (['{"prompt": "a"}', "{oops"], ["line 2: not JSON"]),
        (['{"prompt": "a"}', '{"text": "b"}'], ["line 2: unknown keys ['text']"]),
        (['{"max_new_tokens": 3}'], ["line 1: give exactly one of prompt or infill"]),
        (['{"prompt": "a", "infill": "b [[2]]"}'], ["line 1: give exactly one of"]),
        (['{"prompt": "a", "max_new_tokens": 0}'], ["line 1: max_new_tokens must be"]),
        (
            ['{"prompt": "a"}', '{"prompt": "' + "the morning was fine " * 20 + '"}'],
            ["line 2:", "longer than the canvas"],
        ),
        (['{"infill": "oops [[3 and more"}'], ["line 1:", "never closed"]),
        ([], ["the prompts file has no rows"]),
    ],
)
def test_a_bad_line_is_a_one_line_error_naming_it(tiny_masked_checkpoint, tmp_path, lines, needles):
    path = write_rows(tmp_path / "rows.jsonl", lines)
    args = [f"ckpt={tiny_masked_checkpoint}", f"prompts={path}", "steps=2", "progress=false"]
    one_line_error(run_main("cdlm-sample", *args, cwd=tmp_path), *needles)


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["prompts=/no/such/rows.jsonl"], ["prompts file not found"]),
        (["prompts=rows.jsonl", "prompt=a"], ["prompts= carries its own rows; drop prompt"]),
        (["prompts=rows.jsonl", "guidance.on=label"], ["needs label=NAME"]),
    ],
)
def test_prompts_refuses_what_it_does_not_take(tiny_masked_checkpoint, tmp_path, args, needles):
    write_rows(tmp_path / "rows.jsonl", ['{"prompt": "a"}'])
    result = run_main("cdlm-sample", f"ckpt={tiny_masked_checkpoint}", *args, cwd=tmp_path)
    one_line_error(result, *needles)


def test_a_row_alone_keeps_todays_stream():
    """Per-row generators draw as one generator did: a row of ``rng.Rows`` is the plain draw of
    its own length (so goldens and a row sampled alone do not move), whatever pads it."""
    from cdlm import rng

    rows = rng.Rows([rng.generator(7), rng.generator(8)], [3, 5])
    drawn = rng.rand((2, 5, 4), rows)
    assert torch.equal(drawn[0, :3], torch.rand((1, 3, 4), generator=rng.generator(7))[0])
    assert torch.equal(drawn[0, 3:], torch.zeros(2, 4))
    assert torch.equal(drawn[1], torch.rand((5, 4), generator=rng.generator(8)))
    assert torch.equal(
        rng.rand((2, 5), rng.generator(1)), torch.rand((2, 5), generator=rng.generator(1))
    )


def tiny_networks():
    from cdlm.networks.causal_lm import CausalLM
    from cdlm.networks.transformer import Transformer

    torch.manual_seed(0)
    own = Transformer(11, in_vocab=11, d_model=16, n_layers=2, n_heads=2, self_condition=False)
    wake(own)
    llama = {
        "model_type": "llama",
        "vocab_size": 11,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
    }
    return [own, CausalLM(base=llama, out_dim=11, in_vocab=11, max_seq_len=16)]


@pytest.mark.parametrize("index", [0, 1], ids=["transformer", "causal_lm"])
def test_padding_is_hidden_from_every_query(index):
    """A right-padded row through the network with ``lengths`` is the row alone: uncached, and
    through a cache that recorded which of its keys are padding; without ``lengths`` the padding
    changes it."""
    net = tiny_networks()[index].double().eval()
    x, t = torch.randint(0, 11, (2, 9)), torch.rand(2, dtype=torch.float64)
    lengths = torch.tensor([5, 9])
    with torch.no_grad():
        alone = net(x[:1, :5], t[:1])[0]
        padded = net(x, t, lengths=lengths)[0, :5]
        # a cache that holds row 0's padding (written in one pass), then a block re-run
        # read-only at positions 3..4 (Fast-dLLM's refresh and step)
        cache, own, at = net.new_cache(), net.new_cache(), torch.arange(3, 5)
        net(x, t, cache=cache, lengths=lengths)
        net(x[:1, :5], t[:1], cache=own)
        with cache.read_only(), own.read_only():
            tail = net(x[:, 3:5], t, cache=cache, positions=at, lengths=lengths)[0]
            tail_alone = net(x[:1, 3:5], t[:1], cache=own, positions=at)[0]
        leaked = net(x, t)[0, :5]
    torch.testing.assert_close(padded, alone, rtol=0, atol=1e-12)
    torch.testing.assert_close(tail, tail_alone, rtol=0, atol=1e-12)
    assert (leaked - alone).abs().max() > 1e-3


def test_stop_at_eos_ends_each_row_on_its_own():
    """Per-row stop-at-EOS (hand-made canvases, [MASK] = 9, EOS = 0): a row with an EOS and no
    mask before it, and only masks after the block in its own canvas, is filled with EOS; one
    without an EOS goes on; a row's right padding (EOS, past its length) is not its canvas."""
    from cdlm.samplers.masked_steps import ended_rows

    x = torch.tensor([[5, 0, 9, 9, 9], [5, 6, 9, 9, 9], [5, 0, 9, 0, 0], [9, 0, 9, 9, 9]])
    got = ended_rows(x, 2, 0, 9, [5, 5, 3, 5])
    want = [[5, 0, 0, 0, 0], [5, 6, 9, 9, 9], [5, 0, 0, 0, 0], [9, 0, 9, 9, 9]]
    assert got.tolist() == want
