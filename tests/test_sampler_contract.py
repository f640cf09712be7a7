"""One contract that every registered sampler passes (diffusers' shared scheduler test base).

``CASES`` holds one row per sampler config (``conf/sampler/<name>.yaml``, as ``sampler=<name>``
chooses it): the process kind it runs on, its options, and what it must count (network calls,
callbacks) as exact rules. Several configs may target one function (the masked samplers are
one loop with different step rules, each rule registered under its config's name). Each test is parametrized over the whole
table, so a new sampler or config gets every check once it has a row, and
``test_every_sampler_config_has_a_case`` fails, naming it, until it does.

The network is a real tiny ``Transformer`` in float64 with a counting hook, built the way
``cdlm.generation.generate`` builds the denoiser (``process.conditioned_denoiser(network)``). The processes
are built without shifted prediction (no BOS prepended), so the positions the network sees
per call are exactly the sequence length.

``GOLDEN`` pins what each sampler draws today (tokens, NFE, a fingerprint of the final state)
from one seeded network and seed. A change that alters samples must fail here; if the change is
intended, rewrite ``tests/data/golden_samples.json`` with ``python tests/test_sampler_contract.py``
and say why in the commit.
"""

from __future__ import annotations

import json
import math
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from cdlm import config_dir
from cdlm.denoiser import NetworkDenoiser, Prediction, Wrapper
from cdlm.generation import named_sampler
from cdlm.networks.transformer import Transformer
from cdlm.processes.autoregressive import AutoregressiveProcess
from cdlm.processes.block import BlockProcess
from cdlm.processes.block_denoiser import BlockDenoiser
from cdlm.processes.gaussian import GaussianProcess
from cdlm.processes.hybrid import HybridMasking
from cdlm.processes.inputs import PosteriorInput, VectorInput
from cdlm.processes.masked import MaskedProcess
from cdlm.processes.uniform import UniformProcess
from cdlm.samplers import SAMPLERS, SampleOutput, StepInfo, uniform_grid
from cdlm.samplers.base import sampler_name
from cdlm.samplers.blockwise import DualCache, PrefixCache
from cdlm.samplers.remdm import ReMDM
from cdlm.samplers.rules import ExactK, Threshold

V, D = 12, 8  # vocabulary (EOS/BOS = 0, [MASK] = V - 1) and gaussian embedding width
EOS, MASK = 0, V - 1
B, L, STEPS, SEED = 2, 8, 4, 23
F64 = torch.float64


# --- the two factories (process constructors are being refactored: adapt only these) ----------


def make_process(kind: str) -> nn.Module:
    """A toy-sized float64 process of ``kind``; seeded, as the gaussian embedding table is random.
    No shifted prediction: the network then sees exactly L positions per call. The gaussian
    network reads x_t and is self-conditioned (the golden samples were made at 683937b, where
    every vector-input network was)."""
    builders: dict[str, Callable[[], nn.Module]] = {
        "gaussian": lambda: GaussianProcess(
            vocab_size=V, embed_dim=D, input=VectorInput(self_cond_prob=0.5)
        ),
        # CANDI's hybrid corruption (sampler=hybrid): soft-token input, which sees the anchors
        "hybrid_gaussian": lambda: GaussianProcess(
            vocab_size=V, embed_dim=D, input=PosteriorInput(), hybrid=HybridMasking()
        ),
        "masked": lambda: MaskedProcess(vocab_size=V, mask_id=MASK, eos_id=EOS, shift=False),
        "autoregressive": lambda: AutoregressiveProcess(vocab_size=V, bos_id=EOS),
        "uniform": lambda: UniformProcess(vocab_size=V),
        "block": lambda: BlockProcess(vocab_size=V, mask_id=MASK, block_size=4, eos_id=EOS),
        # the layout speculative decoding verifies with: shifted, a causal clean stream
        "verifying_block": lambda: BlockProcess(
            vocab_size=V, mask_id=MASK, block_size=4, eos_id=EOS, shift=True, causal_clean=True
        ),
    }
    torch.manual_seed(0)
    return builders[kind]().double()


def make_network(process: nn.Module, num_classes: int = 0, seed: int = 1) -> Transformer:
    """A tiny seeded float64 Transformer with the widths ``process`` asks for (class-conditional
    with ``num_classes``). Every weight is nudged off adaLN-Zero's identity start, or attention
    and the time input would not reach the output and the golden tokens would not guard them."""
    torch.manual_seed(seed)
    network = Transformer(
        **process.network_kwargs,
        d_model=16,
        n_layers=1,
        n_heads=2,
        max_seq_len=64,
        num_classes=num_classes,
    ).double()
    with torch.no_grad():
        for p in network.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return network.eval()


# --- what a run records, and the exact counting rules stated per sampler ------------------------


class Spy:
    """Counts a network's calls and the sequence positions they process (per sequence), through a
    forward pre-hook, so the network itself runs unchanged."""

    def __init__(self, network: nn.Module) -> None:
        self.calls, self.positions = 0, 0
        network.register_forward_pre_hook(self.see, with_kwargs=True)

    def see(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        x = args[0] if args else kwargs["x"]
        self.calls, self.positions = self.calls + 1, self.positions + x.shape[1]


@dataclass
class Run:
    """One sampler run: its output, every callback, the start state and the spy's counts."""

    steps: int
    out: SampleOutput
    seen: list[StepInfo]
    start: Tensor
    process: nn.Module
    calls: int
    positions: int


Rule = Callable[[Run], int]


def per_step(run: Run) -> int:
    """One per grid interval."""
    return run.steps


def heun_nfe(run: Run) -> int:
    """Two calls per step, one on the last (which returns the x0 estimate)."""
    return 2 * run.steps - 1


def dormand_prince(run: Run) -> int:
    """Adaptive RK45 (scipy's Dormand-Prince pair, first same as last): one call at the start of
    the (single) interval, one to choose the first step size, then six per step tried, however
    many the error control takes; the final prediction reuses the last stage. The count of that
    form nearest below the calls seen: an extra or a missing call shows."""
    return 2 + 6 * ((run.calls - 2) // 6)


def steps_until_decided(run: Run) -> int:
    """Masked: one step per grid interval until no [MASK] is left (a step may commit the rest)."""
    mask = run.process.mask_id
    return next((j + 1 for j, st in enumerate(run.seen) if not (st.x == mask).any()), run.steps)


def calls_after_a_change(run: Run) -> int:
    """Cached ancestral: the first step calls the network; a later one only if the step before
    it committed a token (the denoiser is time-free, so an unchanged input repeats its output)."""
    before = [run.start, *(st.x for st in run.seen[:-1])]
    changed = [not torch.equal(a, st.x) for a, st in zip(before, run.seen, strict=True)]
    return 1 + sum(changed[:-1])


def steps_and_cached_blocks(run: Run) -> int:
    """Block diffusion with its KV cache: one call per denoising step; a block's first step
    writes the finished block before it in the same call (L = 8 is two blocks of 4)."""
    return len(run.seen)


def verified(run: Run) -> int:
    """Speculative decoding: one report per verifying call."""
    return int(run.out.stats["drafts"])


def verified_and_drafted(run: Run) -> int:
    """Speculative decoding: the verifying calls, plus a draft-only call at the start and after
    each rejection that leaves positions to draft (the network's own count checks both)."""
    return int(run.out.stats["drafts"] + run.out.stats["draft_calls"])


def tokens_generated(run: Run) -> int:
    """AR: one call per token, up to the position where every row has produced EOS."""
    eos = run.out.tokens == run.process.bos_id
    return int(eos.float().argmax(-1).max()) + 1 if bool(eos.any(-1).all()) else L


@dataclass(frozen=True)
class Case:
    """How to run one registered sampler, and what its NFE and callback count must be.

    kind: the process it runs on; nfe, callbacks: exact rules over the run; steps: grid
    intervals; options: passed to the sampler.
    """

    kind: str
    nfe: Rule
    callbacks: Rule
    steps: int = STEPS
    options: dict = field(default_factory=dict)
    build: str | None = None  # the ``make_process`` builder, when it is not ``kind``'s


CASES: dict[str, Case] = {
    "ddpm": Case("gaussian", per_step, per_step),
    "ddim": Case("gaussian", per_step, per_step, options={"eta": 0.5}),
    "rolling": Case("gaussian", per_step, per_step, options={"token_steps": 2}),
    "euler": Case("gaussian", per_step, per_step),
    "heun": Case("gaussian", heun_nfe, per_step),
    "dpmpp_2m": Case("gaussian", per_step, per_step),
    "euler_maruyama": Case("gaussian", per_step, per_step),
    "consistency": Case("gaussian", per_step, per_step),
    # loose tolerances and one interval keep the solve to a handful of calls
    "adaptive": Case("gaussian", dormand_prince, per_step, 1, {"rtol": 1e-2, "atol": 1e-2}),
    "ancestral": Case("masked", steps_until_decided, steps_until_decided),
    # more steps than positions: some steps reveal nothing, and the next one skips its call
    "cached_ancestral": Case("masked", calls_after_a_change, steps_until_decided, steps=16),
    # ceil(open / steps_left) per step decides the canvas exactly at the last step when L >= steps.
    # Temperature 0 (its config default) on purpose: on the all-[MASK] canvas every position has
    # the same logits up to ~1e-17, so with drawn proposals which ones commit first, and the
    # golden tokens, would hang on rounding.
    "confidence": Case("masked", per_step, per_step),
    "threshold": Case("masked", steps_until_decided, steps_until_decided),
    "entropy_bounded": Case("masked", steps_until_decided, steps_until_decided),
    # k = 1 (its config default) commits one token per step: L steps decide the canvas
    "exact_k": Case("masked", per_step, per_step, steps=L),
    "ar": Case("autoregressive", tokens_generated, tokens_generated),
    "duo_ancestral": Case("uniform", per_step, per_step),
    # the corrector reuses the predictor's x0 estimate: one call per interval. Half corrector, so
    # the golden tokens pin it (the config's remdm, eta 0.01, is ~ancestral on a 4-step grid)
    "duo_psi": Case("uniform", per_step, per_step, options={"mode": "constant", "eta": 0.5}),
    "block": Case("block", steps_and_cached_blocks, steps_until_decided),
    # revises: every step calls the network, masked or not (its last step unmasks the rest)
    "remdm": Case("masked", per_step, per_step),
    "speculative": Case("block", verified_and_drafted, verified, build="verifying_block"),
    "hybrid": Case("gaussian", per_step, per_step, build="hybrid_gaussian"),
}

# Further options whose NFE and positions accounting differs: the rolling per-token grid,
# semi-autoregressive blocks, and the AR sampler without its KV cache (reruns the prefix).
VARIANTS: list[tuple[str, dict]] = [
    ("ddpm", {"token_steps": 3}),
    ("ancestral", {"block_length": 3}),
    ("confidence", {"block_length": 4}),
    ("ar", {"use_cache": False}),
    ("block", {"cache": None}),  # the clean past recomputed in every call
    ("ancestral", {"block_length": 4, "cache": PrefixCache()}),  # Fast-dLLM's approximate caches
    ("threshold", {"block_length": 4, "cache": DualCache()}),
    ("entropy_bounded", {"block_length": 4, "cache": PrefixCache()}),
    ("confidence", {"block_length": 4, "cache": DualCache(refresh=1)}),
    ("block", {"rule": Threshold()}),
    ("block", {"rule": ExactK(k=2)}),  # two steps per block of 4
    ("exact_k", {"rule": ExactK(k=3)}),  # 3, 3, 2: decided after 3 of its 8 steps
    ("exact_k", {"block_length": 4, "cache": DualCache()}),
    ("remdm", {"block_length": 4}),
    ("remdm", {"block_length": 4, "cache": PrefixCache()}),
    ("remdm", {"rule": ReMDM(schedule="conf")}),
    ("remdm", {"rule": ReMDM(schedule="loop", eta=0.1)}),
    ("duo_psi", {"mode": "pc"}),
    ("duo_psi", {"mode": "remdm_rescale", "eta": 0.5}),
]


def configs() -> list[str]:
    """The names ``sampler=<name>`` chooses: every ``conf/sampler/*.yaml``."""
    return sorted(p.stem for p in (config_dir() / "sampler").glob("*.yaml"))


DenoiserFactory = Callable[[nn.Module, nn.Module, Tensor | None], Callable]


def real(process: nn.Module, network: nn.Module, data: Tensor | None) -> Callable:
    """The denoiser ``cdlm.generation.generate`` gives a sampler (unguided, nothing held)."""
    return process.sampling_denoiser(network)


def run(
    name: str,
    make_denoiser: DenoiserFactory = real,
    data: Tensor | None = None,
    global_seed: int = 0,
    **options,
) -> Run:
    """Runs sampler ``name`` as ``cdlm.generation.generate`` would: prior and sampler share one generator.
    ``global_seed`` reseeds torch's global stream just before sampling, which a sampler must not
    read (the factories reseed it too, so without this two runs could not tell)."""
    case = CASES[name]
    process = make_process(case.build or case.kind)
    network = make_network(process)
    spy = Spy(network)
    denoiser = make_denoiser(process, network, data)
    generator = torch.Generator().manual_seed(SEED)
    start = process.prior((B, L), torch.device("cpu"), generator)
    start = start.to(F64) if start.is_floating_point() else start
    seen: list[StepInfo] = []
    torch.manual_seed(global_seed)
    out = named_sampler(name)(
        denoiser,
        start.clone(),
        uniform_grid(case.steps),
        process=process,
        generator=generator,
        callback=seen.append,
        **(case.options | options),
    )
    return Run(case.steps, out, seen, start, process, spy.calls, spy.positions)


# --- oracles: denoisers that know the data --------------------------------------------------------


def point_mass(data: Tensor, dtype: torch.dtype = F64) -> Tensor:
    """(B, L, V) log-probabilities, 0 on the data token and -inf elsewhere."""
    return torch.full((*data.shape, V), -math.inf, dtype=dtype).scatter_(-1, data[..., None], 0.0)


def oracle(process: nn.Module, network: nn.Module, data: Tensor) -> Callable:
    """A denoiser certain of ``data`` (B, L): gaussian, the true x0 and its token; masked and
    block, all mass on the true token where what it sees through its KV cache is right
    (``Seeing``); AR, the real predictor (so its KV cache advances as in use) with its
    next-token distribution forced onto the data. Call i of the AR sampler predicts position i,
    cached (one new input) or not (the prefix again)."""
    if process.kind == "gaussian":
        x0 = process.embedding(data).detach()
        return lambda x_t, t, self_cond=None, **kw: Prediction(x0=x0, logits=point_mass(data))
    if getattr(process, "verifies", False):
        return KnowsData(data, process, network)
    if process.kind in ("masked", "block"):
        return Seeing(data, process, network)
    if process.kind == "uniform":
        return Certain(data)
    return ForcedNextToken(process.sampling_denoiser(network), data)


class Certain(NetworkDenoiser):
    """Uniform-state: all mass on ``data`` everywhere, whatever the canvas holds."""

    def __init__(self, data: Tensor) -> None:
        self.data = data

    def __call__(self, z, t, self_cond=None, **kw) -> Prediction:
        return Prediction(logits=point_mass(self.data))


class Seeing(NetworkDenoiser):
    """A masked or block-diffusion denoiser certain of ``data`` (B, L) only where what it sees
    agrees with it, so that a wrong KV-cache read changes the samples.

    Like a network, it sees the canvas at the positions it runs (block diffusion: also the clean
    past before them that the cache lacks, all of it without a cache) and the rest through the
    KV cache, into which each call that writes puts, in every layer, each position it runs as
    key and its token as value (block diffusion keeps only the clean past).
    It predicts the true token at the positions asked for only if it sees each position its model
    must see exactly once (block diffusion: all up to the window's end, nothing after; a
    full-attention model: the whole canvas), everything before the window decided, and no token
    that contradicts ``data``; otherwise a wrong token. A missing, stale, duplicated or misplaced
    cache entry thus breaks "the oracle gets the data back". ``network`` gives the cache."""

    def __init__(self, data: Tensor, process: nn.Module, network: nn.Module) -> None:
        self.data, self.mask_id, self.network = data, process.mask_id, network
        self.causal = process.kind == "block"  # a block sees its past only
        self.calls = 0

    def network_length(self, length: int) -> int:
        return length

    def __call__(self, z, t, self_cond=None, *, positions=None, cache=None, **kw) -> Prediction:
        self.calls += 1
        runs = torch.arange(z.shape[1]) if positions is None else positions
        seen_at = runs
        if positions is not None and self.causal:  # the clean past the cache lacks, run too
            past = 0 if cache is None else cache.length
            seen_at = torch.cat([torch.arange(past, int(positions[0])), positions])
        at, tokens = seen_at.expand(z.shape[0], -1), z[:, seen_at]
        if cache is not None:
            keys, values = at[:, None, :, None].to(F64), tokens[:, None, :, None].to(F64)
            for layer in cache:
                k, v = layer.extend(keys, values, write=not cache.frozen)
            at, tokens = k[:, 0, :, 0].long(), v[:, 0, :, 0].long()
            if self.causal and not cache.frozen:
                cache.truncate(int(positions[0]))  # keeps the clean past, not the window
        must = torch.arange(int(runs.max()) + 1 if self.causal else z.shape[1])
        once = at.shape[1] == len(must) and bool((at.sort(-1).values == must).all())
        right = once and bool(
            ((tokens == self.data.gather(1, at)) | (tokens == self.mask_id)).all()
        )
        decided = not bool(((at < int(runs.min())) & (tokens == self.mask_id)).any())
        truth = self.data[:, runs]
        return Prediction(logits=point_mass(truth if right and decided else truth % (V - 2) + 1))


class KnowsData(BlockDenoiser):
    """The oracle of a verifying block model (speculative decoding): the real window calls (so
    its KV cache and call counts are those of use), their draft and verifying outputs forced
    onto ``data``. Every draft is then kept whole."""

    def __init__(self, data: Tensor, process: nn.Module, network: nn.Module) -> None:
        super().__init__(network, process.mask_id, process.block_size, process.eos_id, True)
        self.data = data

    def chunk(self, z, positions, cache=None, start=None, **kwargs):
        out = super().chunk(z, positions, cache, start, **kwargs)
        out.window = point_mass(self.data[:, positions])
        out.clean = point_mass(self.data[:, out.clean_positions])
        return out


class ForcedNextToken(Wrapper):
    """The AR oracle (see ``oracle``); a wrapper, so the contract's other calls (``new_cache``,
    ``shift``) reach the model."""

    def __init__(self, denoiser: Callable, data: Tensor) -> None:
        self.denoiser, self.data, self.calls = denoiser, data, 0

    def __call__(self, tokens: Tensor, t: Tensor | None = None, self_cond=None, **kw) -> Prediction:
        logits = self.denoiser(tokens, t, self_cond, **kw).logits.clone()
        logits[:, -1] = point_mass(self.data[:, self.calls])
        self.calls += 1
        return Prediction(logits=logits)


# --- golden samples: regenerate only for an intended change (see the module docstring) -----------


def fingerprint(x: Tensor) -> float:
    """The final state as one number, position-weighted so that a permutation shows: it pins
    the gaussian trajectories, whose tokens alone can miss a small change. Compared to a relative
    1e-4: fp32 rounding in the gaussian denoiser moves it by ~1e-7 (~3e-5 through the adaptive
    solver's step-size control)."""
    return float((x.double().flatten() * torch.arange(1, x.numel() + 1)).sum())


GOLDEN_PATH = Path(__file__).parent / "data" / "golden_samples.json"


def golden_samples() -> dict[str, dict]:
    """name -> {nfe, tokens, fingerprint} for every case, from the current code."""
    samples = {}
    for name in CASES:
        out = run(name).out
        samples[name] = {"nfe": out.nfe, "tokens": out.tokens.tolist(), "x": fingerprint(out.x)}
    return samples


GOLDEN: dict[str, dict] = (
    json.loads(GOLDEN_PATH.read_text())["samplers"] if GOLDEN_PATH.exists() else {}
)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One intra-op thread, so reductions run in one order and float results repeat exactly."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --- the contract ---------------------------------------------------------------------------------


def test_every_sampler_config_has_a_case() -> None:
    """A sampler config without a row would silently skip the whole contract, and so would a
    registered sampler that no config chooses."""
    missing, stale = sorted(set(configs()) - set(CASES)), sorted(set(CASES) - set(configs()))
    assert not missing, f"conf/sampler configs without a row in CASES: {missing}"
    assert not stale, f"rows in CASES for configs no longer in conf/sampler: {stale}"
    named = {name: sampler_name(named_sampler(name)) for name in CASES}
    misnamed = sorted(n for n, got in named.items() if got != n)
    assert not misnamed, f"configs whose sampler is registered under another name: {misnamed}"
    unchosen = sorted(set(SAMPLERS) - set(CASES))
    assert not unchosen, f"registered samplers that no conf/sampler config chooses: {unchosen}"
    for name, case in CASES.items():
        assert case.kind in SAMPLERS[name], f"{name} is registered for {SAMPLERS[name]}"
    assert set(GOLDEN) == set(CASES), (
        "add the new rows' golden samples: python tests/test_sampler_contract.py"
    )


def case_id(name: str, options: dict) -> str:
    return name + "".join(f"-{k}={v}" for k, v in options.items())


ALL_OPTIONS = [pytest.param(n, o, id=case_id(n, o)) for n, o in [(n, {}) for n in CASES] + VARIANTS]


@pytest.mark.parametrize("name, options", ALL_OPTIONS)
def test_nfe_and_positions_are_what_the_network_saw(name: str, options: dict) -> None:
    """NFE and positions are the compute budget every comparison of samplers is made at."""
    r = run(name, **options)
    assert r.out.nfe == r.calls
    if not options:
        assert r.out.nfe == CASES[name].nfe(r)
    positions = r.out.positions if r.out.positions is not None else r.out.nfe * L
    assert positions == r.positions


@pytest.mark.parametrize("name", CASES)
def test_one_callback_per_step_and_the_steps_tile_time(name: str) -> None:
    """Trajectory logging and progress bars rely on one report per step, in order, from t = 1."""
    r = run(name)
    assert len(r.seen) == CASES[name].callbacks(r)
    assert [st.i for st in r.seen] == list(range(len(r.seen)))
    assert r.seen[0].t == 1.0
    # consecutive steps join end to end; a block sampler starts each block at t = 1 again
    assert all(a.s == b.t or b.t == 1.0 for a, b in zip(r.seen, r.seen[1:], strict=False))
    if len(r.seen) == r.steps and r.process.kind != "autoregressive":
        assert r.seen[-1].s == 0.0
    assert torch.equal(r.seen[-1].x, r.out.x)


@pytest.mark.parametrize("name", CASES)
def test_the_generator_alone_decides_the_samples(name: str) -> None:
    """`cdlm-sample seed=` must reproduce samples whatever else touched torch's global stream."""
    first, second = run(name, global_seed=1), run(name, global_seed=2)
    assert first.out.tokens.shape == (B, L) and first.out.tokens.dtype == torch.long
    assert torch.equal(first.out.tokens, second.out.tokens)
    assert torch.equal(first.out.x, second.out.x) and first.out.nfe == second.out.nfe


@pytest.mark.parametrize("name, options", ALL_OPTIONS)
def test_an_oracle_gets_the_data_back(name: str, options: dict) -> None:
    """Given a perfect denoiser a sampler must return the data exactly: any bias is its own (and
    a cached sampler's oracle sees a wrong cache read, see ``Seeing``)."""
    # no EOS (the samplers would stop there) and no [MASK]
    data = torch.randint(1, V - 1, (B, L), generator=torch.Generator().manual_seed(5))
    r = run(name, oracle, data, **options)
    assert torch.equal(r.out.tokens, data)
    if r.process.kind == "gaussian":
        x0 = r.process.embedding(data)
        torch.testing.assert_close(r.out.x, x0, atol=1e-10, rtol=0)
    else:
        assert torch.equal(r.out.x, data)


@pytest.mark.parametrize("name", CASES)
def test_golden_samples(name: str) -> None:
    """A refactor must not change what any sampler draws."""
    golden, out = GOLDEN[name], run(name).out
    assert out.tokens.tolist() == golden["tokens"] and out.nfe == golden["nfe"]
    assert fingerprint(out.x) == pytest.approx(golden["x"], rel=1e-4)


if __name__ == "__main__":  # rewrites the golden file from the current code
    torch.set_num_threads(1)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        cwd=GOLDEN_PATH.parent,
    ).stdout.strip()
    rows = [f"  {json.dumps(n)}: {json.dumps(v)}" for n, v in golden_samples().items()]
    head = f'{{"generated_at": "{commit}", "by": "python tests/test_sampler_contract.py",\n'
    GOLDEN_PATH.write_text(head + ' "samplers": {\n' + ",\n".join(rows) + "\n}}\n")
    print(f"wrote {GOLDEN_PATH}")
