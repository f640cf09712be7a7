"""Gradient clipping by norm under FSDP goes through the sharded module's own clip_grad_norm_
(Lightning's FSDP precision plugin refuses 'norm': seen on a GPU, docs/results/gpu.md); elsewhere it is
Lightning's clip_gradients."""

from types import SimpleNamespace

from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy

from cdlm.training.optim import clip_gradients


class Spy:
    def __init__(self, strategy) -> None:
        self.calls: list[tuple] = []
        model = SimpleNamespace(clip_grad_norm_=lambda v: self.calls.append(("fsdp", v)))
        self.trainer = SimpleNamespace(strategy=strategy, model=model)

    def clip_gradients(self, optimizer, value, algorithm) -> None:
        self.calls.append(("lightning", value, algorithm))


def test_fsdp_clips_the_norm_over_its_shards_and_other_strategies_use_lightnings():
    sharded = Spy(FSDPStrategy())
    clip_gradients(sharded, None, 1.0, "norm")
    clip_gradients(sharded, None, 1.0, None)  # Lightning's default algorithm is the norm
    clip_gradients(sharded, None, 0.5, "value")
    clip_gradients(sharded, None, None, None)
    assert sharded.calls == [
        ("fsdp", 1.0),
        ("fsdp", 1.0),
        ("lightning", 0.5, "value"),
        ("lightning", None, None),
    ]
    plain = Spy(DDPStrategy())
    clip_gradients(plain, None, 1.0, "norm")
    assert plain.calls == [("lightning", 1.0, "norm")]
