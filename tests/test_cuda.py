"""cdlm on a CUDA GPU (marker ``cuda``; scripts/gpu_check.sh runs them): bf16 autocast through
the network, the fused SDPA kernels against the math kernel, the KV cache, block diffusion's
masks and fused AdamW, each against a reference computed on the same GPU or on the CPU. Every
test is skipped, saying so, where torch sees no CUDA device."""

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch.nn.attention import SDPBackend, sdpa_kernel

from cdlm import config_dir
from cdlm.networks.transformer import Transformer
from cdlm.processes.autoregressive import AutoregressiveProcess
from cdlm.processes.block_masks import vectorised_mask
from cdlm.samplers import uniform_grid
from cdlm.samplers.autoregressive import sample_ar
from cdlm.training.optim import configure_optimization

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none seen)"),
]
V, L, BOS = 97, 64, 96


@pytest.fixture(autouse=True)
def full_fp32_matmuls():
    """fp32 references in full fp32: no TF32, whatever an earlier import chose."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(before)


def net(causal: bool = False, self_condition: bool = False) -> Transformer:
    """A small Transformer on the GPU, moved off the adaLN-Zero identity start so that every
    path carries signal."""
    torch.manual_seed(0)
    network = Transformer(
        out_dim=V,
        in_vocab=V,
        d_model=128,
        n_layers=2,
        n_heads=4,
        max_seq_len=2 * L,
        self_condition=self_condition,
        causal=causal,
    )
    for p in network.parameters():
        p.data += 0.05 * torch.randn_like(p)
    return network.cuda().eval()


def batch(size: int = 4, length: int = L) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, V, (size, length), generator=g).cuda(), torch.rand(size).cuda()


def test_bf16_autocast_forward_and_backward_track_fp32():
    network = net().train()
    tokens, t = batch()
    target = torch.randint(0, V, tokens.shape, device="cuda")
    reference = network(tokens, t).float()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = network(tokens, t)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), target.flatten())
    assert logits.dtype == torch.bfloat16
    loss.backward()
    grads = [p.grad for p in network.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert sum(g.abs().sum() for g in grads) > 0
    err = (logits.float() - reference).abs().max() / reference.abs().max()
    assert err < 0.05, f"bf16 logits differ from fp32 by {err:.3g} of their range"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "dtype,backend,tol",
    [
        (torch.float32, SDPBackend.EFFICIENT_ATTENTION, 1e-4),
        (torch.bfloat16, SDPBackend.FLASH_ATTENTION, 3e-2),
        (torch.bfloat16, SDPBackend.EFFICIENT_ATTENTION, 3e-2),
    ],
)
def test_fused_attention_kernels_match_the_math_kernel(causal, dtype, backend, tol):
    """The network's output through one fused SDPA kernel against the math kernel in fp32."""
    network = net(causal)
    tokens, t = batch()
    with torch.no_grad():
        with sdpa_kernel(SDPBackend.MATH):
            reference = network(tokens, t)
        with (
            sdpa_kernel(backend),
            torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32),
        ):
            fused = network(tokens, t).float()
    err = (fused - reference).abs().max() / reference.abs().max()
    assert err < tol, f"{backend.name} in {dtype} is {err:.3g} of the range off the math kernel"


def test_ar_sampling_with_the_kv_cache_equals_without_token_for_token():
    network = net(causal=True)
    process = AutoregressiveProcess(vocab_size=V, bos_id=BOS)
    den = process.make_denoiser(network)
    outs = []
    for use_cache in (True, False):
        g = torch.Generator(device="cuda").manual_seed(5)
        x = process.prior((8, L), torch.device("cuda"), g)
        with torch.no_grad():  # the kernels sampling uses
            out = sample_ar(
                den,
                x,
                uniform_grid(1),
                process=process,
                generator=g,
                temperature=0.0,
                use_cache=use_cache,
                stop_at_eos=False,
            )
        outs.append(out)
    cached, uncached = outs
    assert cached.tokens.is_cuda and cached.nfe == uncached.nfe == L
    assert torch.equal(cached.tokens, uncached.tokens)


def test_block_masks_and_the_masked_forward_on_cuda_equal_the_cpu():
    """Block diffusion's (2L, 2L) training mask built on the GPU equals the CPU's, and the
    network's pass over x_t ⊕ x0 under it agrees with the same pass on the CPU."""
    block = 4
    mask = vectorised_mask(L, block, causal_clean=True, device="cuda")
    assert torch.equal(mask.cpu(), vectorised_mask(L, block, causal_clean=True))
    network = net()
    tokens, t = batch(length=2 * L)
    with torch.no_grad():
        on_gpu = network(tokens, t, attn_mask=mask).cpu()
        on_cpu = network.cpu()(tokens.cpu(), t.cpu(), attn_mask=mask.cpu())
    torch.testing.assert_close(on_gpu, on_cpu, atol=1e-4, rtol=1e-4)


def test_fused_adamw_from_the_optimizer_config_steps_like_unfused():
    """conf/optimizer/adamw.yaml with fused=true, built by cdlm's own path, one step on the GPU
    from the same gradients: the same weights as the unfused (foreach) step."""
    network = net().train()
    network(*batch()).float().square().mean().backward()
    stepped = []
    for fused in (True, False):
        params = [p.detach().clone().requires_grad_() for p in network.parameters()]
        for copy, p in zip(params, network.parameters(), strict=True):
            copy.grad = p.grad.clone()
        config = OmegaConf.load(config_dir() / "optimizer" / "adamw.yaml")
        factory = instantiate(OmegaConf.merge(config, {"fused": fused}))
        optimizer = configure_optimization(None, params, factory)
        assert optimizer.defaults["fused"] is fused
        optimizer.step()
        stepped.append(params)
    for a, b in zip(*stepped, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_the_graphed_ar_step_replays_the_fixed_step_token_for_token():
    """``sampler.graph``: the one-token step captured once in a CUDA graph and replayed draws
    what the eager fixed-shape step draws (the same kernels), with a prefill before it, and both
    track the growing cache's logits."""
    network = net(causal=True)
    process = AutoregressiveProcess(vocab_size=V, bos_id=BOS)
    den = process.make_denoiser(network)
    ids = torch.randint(0, V - 1, (8, L), device="cuda", generator=torch.Generator("cuda"))
    editable = torch.arange(L, device="cuda").expand(8, L) >= 5  # a 5-token prompt
    held = process.hold_fixed(den, ids, editable, None)
    outs, logits = [], []
    for options in ({}, {"fixed_shape": True}, {"graph": True}):
        g = torch.Generator(device="cuda").manual_seed(5)
        x = process.prior((8, L), torch.device("cuda"), g)
        seen = []
        with torch.no_grad():
            out = sample_ar(
                held, x, uniform_grid(1), process=process, generator=g, stop_at_eos=False,
                callback=lambda info, seen=seen: seen.append(info.prediction.logits[:, -1]),
                **options,
            )  # fmt: skip
        outs.append(out.tokens)
        logits.append(torch.stack(seen))
    growing, fixed, graphed = outs
    assert torch.equal(graphed, fixed) and torch.equal(logits[2], logits[1])
    assert torch.equal(fixed[~editable], ids[~editable])
    torch.testing.assert_close(logits[1], logits[0], rtol=0, atol=1e-4)
