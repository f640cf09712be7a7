"""Block diffusion and cached decoding: the KV cache changes no logit, block size 1 is the AR
NLL, oracles come back exactly through every sampler and cache, threshold decoding commits."""

import functools
import inspect
import math

import pytest
import torch
from test_sampler_contract import Seeing

from cdlm.networks.transformer import Transformer
from cdlm.processes.block import BlockProcess
from cdlm.processes.block_masks import vectorised_mask
from cdlm.processes.masked import MaskedProcess
from cdlm.samplers import uniform_grid
from cdlm.samplers.blockwise import Calls, DualCache, PrefixCache
from cdlm.samplers.masked import sample_block, sample_masked
from cdlm.samplers.masked_steps import Interval, step_entropy_bounded, step_threshold
from cdlm.samplers.rules import Ancestral, CachedAncestral, Confidence, EntropyBounded, Threshold
from cdlm.schedules import LogLinearMaskSchedule

V, MASK, EOS = 12, 11, 0
sample_ancestral = functools.partial(sample_masked, rule=Ancestral())
sample_cached_ancestral = functools.partial(sample_masked, rule=CachedAncestral())
sample_topk = functools.partial(sample_masked, rule=Confidence())
sample_threshold = functools.partial(sample_masked, rule=Threshold())
sample_entropy_bounded = functools.partial(sample_masked, rule=EntropyBounded())


def network(process, n_layers: int = 2) -> Transformer:
    torch.manual_seed(0)
    net = Transformer(
        d_model=16, n_layers=n_layers, n_heads=2, max_seq_len=40, **process.network_kwargs
    )
    for p in net.parameters():  # leave the identity init: attention must matter
        p.data += 0.1 * torch.randn_like(p)
    return net.double().eval()


def block_process(size: int = 4, eps: float = 1e-3) -> BlockProcess:
    return BlockProcess(V, MASK, block_size=size, eos_id=EOS, schedule=LogLinearMaskSchedule(eps))


def test_vectorised_mask_is_bd3lm_s():
    m = vectorised_mask(4, 2)
    noisy, clean = m[:4], m[4:]
    assert noisy[:, :4].tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1], [0, 0, 1, 1]]
    assert noisy[:, 4:].tolist() == [[0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0]]
    assert not clean[:, :4].any()
    assert clean[:, 4:].tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]]


LAYOUTS = {
    "plain": {},
    "shifted": {"shift": True},
    "shifted_blind": {"shift": True, "sees_last": False},
    "shifted_causal_clean": {"shift": True, "causal_clean": True},
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("size", [1, 4, 5])
def test_cached_logits_equal_the_one_pass_training_logits(size, layout):
    """A block's logits read against the KV cache of its clean past (each step's call writes
    the clean positions the cache lacks), recomputed without a cache, and from the vectorised
    x_t ⊕ x0 training pass all agree, in every layout (the shifted ones read one to the left)."""
    process = BlockProcess(
        V, MASK, block_size=size, eos_id=EOS, schedule=LogLinearMaskSchedule(), **LAYOUTS[layout]
    )
    net = network(process)
    den = process.make_denoiser(net)
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(1, V - 1, (2, 12), generator=g)
    noisy = torch.where(torch.rand(clean.shape, generator=g) < 0.5, MASK, clean)
    t = torch.full((2,), 0.5, dtype=torch.float64)
    with torch.no_grad():
        full = den(noisy, t, clean=clean).logits
        cache = net.new_cache()
        for a in range(0, 12, size):
            block = torch.arange(a, min(a + size, 12))
            canvas = torch.cat([clean[:, :a], noisy[:, a:]], 1)  # the past is clean
            cached = den(canvas, t, positions=block, cache=cache).logits  # writes 0..a-1
            assert cache.length == a
            with cache.read_only():  # a later step of the same block writes nothing
                again = den(canvas, t, positions=block, cache=cache).logits
            uncached = den(canvas, t, positions=block).logits
            for logits in (cached, again, uncached):
                torch.testing.assert_close(logits, full[:, block], atol=1e-10, rtol=0)


def test_block_size_one_bound_is_the_ar_nll():
    """At block size 1 with eps = 0 every position is masked at t = 1 where the ELBO weight is 1,
    so the bound's integrand is the sum of next-token NLLs (each token from its clean past) —
    and the estimator's mean at any t is the same, since weight x P(masked) = 1."""
    process = block_process(1, eps=0.0)
    net = network(process)
    den = process.make_denoiser(net)
    tokens = torch.randint(1, V - 1, (3, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        nll = 0.0
        for i in range(10):  # the AR factorisation: position i masked, its past clean
            canvas = tokens.clone()
            canvas[:, i:] = MASK
            logp = den(canvas, torch.ones(3), positions=torch.tensor([i])).logits[:, 0]
            nll = nll - logp.gather(-1, tokens[:, i : i + 1]).squeeze(-1)
        c = process.corrupt(tokens, torch.ones(3, 10, dtype=torch.float64))
        assert bool(c.noisy.all())
        integrand, _ = process.elbo(den, c, torch.ones_like(tokens, dtype=torch.bool))
        torch.testing.assert_close(integrand, nll, atol=1e-10, rtol=0)
        process.eval()
        draws = [
            process.loss(den, {"tokens": tokens}, torch.Generator().manual_seed(k)).loss
            for k in range(100)
        ]
    mean, spread = torch.stack(draws).mean(), torch.stack(draws).std() / math.sqrt(100)
    assert abs(float(mean - nll.sum() / 30)) < 4 * float(spread)


def oracle(truth: torch.Tensor, process) -> Seeing:
    """Certain of ``truth`` where it sees the right canvas through its KV cache (``Seeing``: a
    wrong cache read makes it predict a wrong token); two layers, all written alike."""
    net = Transformer(out_dim=V, in_vocab=V, d_model=8, n_layers=2, n_heads=2, self_condition=False)
    return Seeing(truth, process, net)


@pytest.mark.parametrize(
    "options",
    [
        {"cache": PrefixCache()},
        {"cache": None},
        {"rule": Threshold(threshold=0.9)},
        {"rule": EntropyBounded(gamma=1.0)},
        {"steps_per_block": 1},
        {"cache": None, "steps_per_block": 1},
    ],
    ids=["prefix", "none", "threshold", "entropy_bounded", "one_step", "none_one_step"],
)
def test_block_samplers_return_the_data_with_an_oracle(options):
    process = block_process(4)
    truth = torch.randint(1, V - 1, (2, 12), generator=torch.Generator().manual_seed(2))
    x = process.prior((2, 12), torch.device("cpu"), None)
    out = sample_block(
        oracle(truth, process),
        x,
        uniform_grid(6),
        process=process,
        generator=torch.Generator().manual_seed(0),
        **options,
    )
    assert torch.equal(out.tokens, truth)


@pytest.mark.parametrize(
    "sampler", [sample_ancestral, sample_topk, sample_threshold, sample_entropy_bounded]
)
@pytest.mark.parametrize(
    "cache",
    [PrefixCache(), DualCache(), PrefixCache(refresh=2), DualCache(refresh=2)],
    ids=["prefix", "dual", "prefix_refresh2", "dual_refresh2"],
)
def test_masked_cached_samplers_return_the_data_with_an_oracle(sampler, cache):
    process = MaskedProcess(V, MASK, EOS)
    truth = torch.randint(1, V - 1, (2, 12), generator=torch.Generator().manual_seed(3))
    x = process.prior((2, 12), torch.device("cpu"), None)
    out = sampler(
        oracle(truth, process),
        x,
        uniform_grid(12),
        process=process,
        generator=torch.Generator().manual_seed(0),
        block_length=4,
        cache=cache,
    )
    assert torch.equal(out.tokens, truth)


@pytest.mark.parametrize(
    ("shift", "cache"),
    [
        (False, PrefixCache()),
        (False, DualCache()),
        (True, PrefixCache()),
        (True, DualCache()),
    ],
    ids=["prefix", "dual", "shifted_prefix", "shifted_dual"],
)
def test_a_cache_read_is_a_full_pass_of_a_one_layer_network(shift, cache):
    """In a one-layer network a position's keys and values depend on its input token alone (a
    masked model has no time input), so a block's logits read against the cache at a step that
    does not rewrite it equal one full uncached pass over the canvas they are read on, as long
    as the cached positions' inputs have not changed since the rewrite (the decided prefix, and
    the still-masked suffix). Deeper networks only approximate this (Fast-dLLM)."""
    process = MaskedProcess(V, MASK, EOS, shift=shift)
    den = process.make_denoiser(network(process, n_layers=1))
    before = process.prior((2, 12), torch.device("cpu"), None)
    seen = []
    out = sample_topk(
        den,
        before.clone(),
        uniform_grid(12),
        process=process,
        generator=torch.Generator().manual_seed(0),
        callback=seen.append,
        block_length=4,
        cache=cache,
        stop_at_eos=False,
    )
    assert len(seen) == 12  # one token per step: 4 steps per block, the first rewrites
    for i, st in enumerate(seen):
        if i % 4:  # a cache read
            a = i // 4 * 4
            full = den(before, torch.full((2,), st.t)).logits[:, a : a + 4]
            torch.testing.assert_close(st.prediction.logits, full, atol=1e-10, rtol=0)
        before = st.x
    uncached = sample_topk(
        den,
        process.prior((2, 12), torch.device("cpu"), None),
        uniform_grid(12),
        process=process,
        block_length=4,
        stop_at_eos=False,
    )
    assert torch.equal(out.tokens, uncached.tokens) and out.positions < uncached.positions


def test_a_shifted_dual_cache_sees_the_blocks_last_token_decided():
    """Issue 24: a shifted model's block [4, 8) is the input of network positions 5..8, so the
    dual cache must not keep position 8 from its rewrite. Deciding the block's last token then
    moves every other block position's prediction (a cache that kept the stale [MASK] there left
    them unchanged by exactly 0) to what a full pass gives, for 5 positions per read, not 4."""
    process = MaskedProcess(V, MASK, EOS, shift=True)
    den = process.make_denoiser(network(process, n_layers=1))
    g = torch.Generator().manual_seed(5)
    x = process.prior((2, 12), torch.device("cpu"), None)
    x[:, :4] = torch.randint(1, V - 1, (2, 4), generator=g)  # the decided prefix
    calls, cache = Calls(den, den.network.new_cache(), 12, torch.device("cpu")), DualCache()
    with torch.no_grad():
        cache.rewrite(calls, x, 4, 8, 1.0)
        masked = cache.read(calls, x, 4, 8, 0.5)
        decided = x.clone()
        decided[:, 7] = 3
        before = calls.positions
        read = cache.read(calls, decided, 4, 8, 0.5)
        full = den(decided, torch.full((2,), 0.5)).logits[:, 4:8]
    assert calls.positions - before == 5
    moved = (read[:, :3].exp() - masked[:, :3].exp()).abs().amax(-1)  # in probability: no -inf
    assert bool((moved > 1e-6).all())
    torch.testing.assert_close(read, full, atol=1e-10, rtol=0)


def test_block_diffusion_reads_its_cache_as_it_would_recompute_the_past():
    """BD3-LM's cache is exact: decoding with the finished blocks read from the KV cache gives,
    at every step, the logits (and so the tokens) of recomputing the clean past in each call,
    with a real two-layer network, for fewer positions."""
    process = block_process(4)
    net = network(process)
    runs = {}
    for name, cache in (("cached", PrefixCache()), ("recomputed", None)):
        seen = []
        out = sample_block(
            process.make_denoiser(net),
            process.prior((2, 12), torch.device("cpu"), None),
            uniform_grid(6),
            process=process,
            generator=torch.Generator().manual_seed(0),
            callback=seen.append,
            cache=cache,
            stop_at_eos=False,
        )
        runs[name] = out, seen
    (cached, cached_steps), (recomputed, recomputed_steps) = runs["cached"], runs["recomputed"]
    assert len(cached_steps) == len(recomputed_steps) == 6
    for c, r in zip(cached_steps, recomputed_steps, strict=True):
        torch.testing.assert_close(c.prediction.logits, r.prediction.logits, atol=1e-10, rtol=0)
    assert torch.equal(cached.tokens, recomputed.tokens)
    assert cached.positions < recomputed.positions


def test_threshold_commits_at_least_one_and_never_changes_a_commit():
    g = torch.Generator().manual_seed(4)
    x = torch.full((3, 8), MASK)
    x[:, :2] = 5
    logits = torch.randn(3, 8, V, generator=g, dtype=torch.float64) * 0.1
    logp = logits.index_fill(-1, torch.tensor([MASK]), -math.inf).log_softmax(-1)  # as SUBS
    iv = Interval(t=1.0, s=0.5, steps_left=3, p_reveal=0.5, keep_t=0.0, keep_s=0.5)
    new = step_threshold(x, logp, x == MASK, iv, g, threshold=0.99)
    assert torch.equal(new[:, :2], x[:, :2])
    assert bool(((new != MASK).sum(-1) >= 3).all())


def test_entropy_bounded_commits_the_surest_within_the_budget_and_never_changes_a_commit():
    """Hand-built entropies at four open positions: 0, ~0.2, ~0.7 and log 5 nats. The summed
    entropy less the largest, prefix by prefix (lowest first), is 0, 0, 0.2, 0.9: gamma = 0
    already takes two (a certain token costs nothing), just under 0.2 two, just over three."""
    x = torch.full((1, 6), MASK)
    x[0, :2] = 5  # committed before: never changed
    rows = [
        torch.tensor([0.0, -math.inf, -math.inf, -math.inf, -math.inf]),  # entropy 0
        torch.tensor([0.0, -3.0, -3.0, -math.inf, -math.inf]),  # ~0.2
        torch.tensor([0.0, -0.5, -1.0, -math.inf, -math.inf]),  # ~0.7 (well under 1.6)
        torch.zeros(5),  # log 5 = 1.61
    ]
    logp = torch.full((1, 6, V), -math.inf, dtype=torch.float64)
    for i, r in enumerate(rows):
        logp[0, 2 + i, :5] = r.double().log_softmax(-1)
    entropy = torch.special.entr(logp[0, 2:].exp()).sum(-1)
    assert entropy.argsort().tolist() == [0, 1, 2, 3]
    cum = entropy.cumsum(0) - entropy  # summed entropy less the largest, prefix by prefix
    iv = Interval(t=1.0, s=0.5, steps_left=3, p_reveal=0.5, keep_t=0.0, keep_s=0.5)
    for gamma, count in [(0.0, 2), (float(cum[2]) - 1e-9, 2), (float(cum[2]) + 1e-9, 3), (9, 4)]:
        g = torch.Generator().manual_seed(0)
        new = step_entropy_bounded(x, logp, x == MASK, iv, g, gamma=gamma)
        assert torch.equal(new[:, :2], x[:, :2])
        decided = (new[0, 2:] != MASK).tolist()
        assert decided == [True] * count + [False] * (4 - count), gamma
    last = Interval(t=0.5, s=0.0, steps_left=1, p_reveal=1.0, keep_t=0.5, keep_s=1.0)
    assert bool((step_entropy_bounded(x, logp, x == MASK, last, g, gamma=0.0) != MASK).all())


def test_sample_block_spells_out_its_options():
    """The rule (ancestral at temperature 1), the cache and stop-at-EOS are in the signature
    with today's defaults; a rule's own option (threshold, gamma) goes on the rule and is
    refused here."""
    params = inspect.signature(sample_block).parameters
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    assert params["rule"].default == Ancestral(temperature=1.0)
    assert params["cache"].default == PrefixCache() and params["stop_at_eos"].default is True
    process = block_process(4)
    x = process.prior((1, 8), torch.device("cpu"), None)
    with pytest.raises(TypeError, match="threshold"):
        sample_block(oracle(x, process), x, uniform_grid(2), process=process, threshold=0.9)


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        (functools.partial(Threshold, threshold=0.0), r"threshold must be in \(0, 1\]"),
        (functools.partial(Threshold, threshold=1.01), r"threshold must be in \(0, 1\]"),
        (functools.partial(EntropyBounded, gamma=-1.0), "gamma must be >= 0"),
    ],
    ids=["threshold_0", "threshold_above_1", "gamma_negative"],
)
def test_a_rule_with_an_option_out_of_range_is_refused_before_any_call(rule, message):
    """The rule checks its options when it is built (a bare 'math domain error' at the first
    step for threshold 0 before); the step function itself refuses them too, and the block
    sampler refuses a step function where a rule object belongs."""
    process = block_process(4)
    x = process.prior((1, 8), torch.device("cpu"), None)

    def uncallable(*args, **kwargs):
        raise AssertionError("the network was called before the rule's options were checked")

    with pytest.raises(ValueError, match=message):
        rule()
    with pytest.raises(TypeError, match="rule must be a step rule object"):
        sample_block(uncallable, x, uniform_grid(2), process=process, rule=step_threshold)
    logp = torch.zeros(1, 8, V, dtype=torch.float64).log_softmax(-1)
    iv = Interval(t=1.0, s=0.5, steps_left=2, p_reveal=0.5, keep_t=0.0, keep_s=0.5)
    step = step_threshold if rule.func is Threshold else step_entropy_bounded
    with pytest.raises(ValueError, match=message):
        step(x, logp, x == MASK, iv, None, **rule.keywords)


def test_cache_choices_that_do_not_fit_are_refused():
    process = block_process(4)
    x = process.prior((1, 8), torch.device("cpu"), None)
    den, grid = oracle(x, process), uniform_grid(2)
    with pytest.raises(ValueError, match="no suffix to cache"):
        sample_block(den, x, grid, process=process, cache=DualCache())
    with pytest.raises(ValueError, match="exact"):
        sample_block(den, x, grid, process=process, cache=PrefixCache(refresh=2))
    with pytest.raises(TypeError, match="cache=prefix|dual|none"):
        sample_block(den, x, grid, process=process, cache="prefix")
    with pytest.raises(ValueError, match="refresh must be >= 1"):
        DualCache(refresh=0)
    masked = MaskedProcess(V, MASK, EOS)
    den = oracle(x, masked)
    with pytest.raises(ValueError, match="block_length"):
        sample_ancestral(den, x, grid, process=masked, cache=DualCache())
    with pytest.raises(ValueError, match="repeat_penalty"):
        sample_topk(den, x, grid, process=masked, cache=PrefixCache(), block_length=4,
                    repeat_penalty=0.5)  # fmt: skip
    with pytest.raises(ValueError, match="CachedAncestral"):  # it has no KV cache to choose
        sample_cached_ancestral(den, x, grid, process=masked, cache=PrefixCache(), block_length=4)
    block = block_process(4)
    with pytest.raises(ValueError, match="decodes its own blocks"):
        sample_masked(den, x, grid, process=block, block_length=4)


@pytest.mark.parametrize(
    ("overrides", "cache"),
    [
        (["cache=prefix"], PrefixCache()),
        (["cache=dual", "cache.refresh=2"], DualCache(refresh=2)),
        (["cache=none"], None),
    ],
)
def test_the_cache_group_builds_the_cache(overrides, cache):
    """``cdlm-sample cache=prefix|dual|none`` chooses the object by ``_target_``; without it
    ``cache`` is absent (the sampler's own default holds)."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from cdlm import config_dir

    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        assert instantiate(compose("sample", overrides=overrides).cache) == cache
        assert "cache" not in compose("sample")


def test_block_process_trains_from_the_cli_and_samples(tmp_path, tiny_corpus):
    """cdlm-train process=block process.block_size=4 trains in one pass over x_t ⊕ x0, and
    cdlm-sample decodes it with the KV cache by default (as cache=prefix); cache=none recomputes
    the clean past (more positions); cache=dual is refused."""
    import re

    from conftest import TINY_TRAIN, run_main

    run = tmp_path / "run"
    result = run_main(
        "cdlm-train",
        "process=block",
        "process.block_size=4",
        f"data.path={tiny_corpus}",
        *TINY_TRAIN,
        f"hydra.run.dir={run}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    runs = {}
    for choice in ([], ["cache=prefix"], ["cache=none"]):
        out = run_main(
            "cdlm-sample",
            f"ckpt={run / 'model.safetensors'}",
            "steps=8",
            "num_samples=2",
            *choice,
            cwd=tmp_path,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        assert "sampler=block" in out.stdout
        positions = int(re.search(r"positions=(\d+)", out.stdout).group(1))
        runs[" ".join(choice)] = out.stdout.split("cdlm-sample:")[0], positions  # samples
    assert runs[""] == runs["cache=prefix"]
    assert runs["cache=none"][1] > runs[""][1]
    bad = run_main("cdlm-sample", f"ckpt={run / 'model.safetensors'}", "cache=dual", cwd=tmp_path)
    assert bad.returncode == 2 and "no suffix to cache" in bad.stderr
    for temperature in ("0", "1"):  # the shifted, causal-clean default verifies its drafts
        out = run_main(
            "cdlm-sample",
            f"ckpt={run / 'model.safetensors'}",
            "sampler=speculative",
            f"sampler.temperature={temperature}",
            "num_samples=2",
            cwd=tmp_path,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        assert "sampler=speculative" in out.stdout and "accepted_per_call=" in out.stdout


def test_the_block_quickstart_recipe_trains_an_ar_phase_then_blocks(tmp_path, tiny_corpus):
    """experiment=block_quickstart: the first half of the steps train the causal clean stream as
    an AR model (only ar_bits_per_token is logged), the rest the block ELBO with complementary
    masks beside it (bits_per_token too)."""
    import csv

    from conftest import TINY_TRAIN, run_main

    run = tmp_path / "run"
    overrides = [o for o in TINY_TRAIN if not o.startswith("trainer.max_steps")]
    result = run_main(
        "cdlm-train",
        "experiment=block_quickstart",
        f"data.path={tiny_corpus}",
        *overrides,
        "trainer.max_steps=4",
        "trainer.max_time=null",
        "lr_scheduler=warmup_cosine",
        f"hydra.run.dir={run}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = list(csv.DictReader(next(run.glob("csv/*/metrics.csv")).open()))
    train = [r for r in rows if r.get("train/ar_bits_per_token")]
    assert train, rows
    first, last = train[0], train[-1]
    assert not first.get("train/bits_per_token") and last.get("train/bits_per_token")
