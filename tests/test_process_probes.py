"""Callers ask a process what it can do through its declared capabilities (``Process`` in
cdlm/processes/base.py), never by probing its attributes; wrappers forward calls, not
attributes."""

import ast
from pathlib import Path

import pytest
import torch

from cdlm.denoiser import NetworkDenoiser, Wrapper
from cdlm.guidance import WithLabel
from cdlm.processes import AutoregressiveProcess, BlockProcess, GaussianProcess, MaskedProcess
from cdlm.processes.base import Process

PACKAGE = Path(__file__).resolve().parents[1] / "cdlm"


def probes(source: str) -> list[str]:
    """The hasattr/getattr calls whose object's expression names a process."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("hasattr", "getattr")
            and node.args
            and "process" in ast.unparse(node.args[0])
        ):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_probe_finder_sees_a_probe():
    assert probes('getattr(model.process, "mask_id", None)\nhasattr(process, "noised")')
    assert not probes('getattr(pl_module, "process", None)')


def test_no_module_outside_processes_probes_a_process():
    found = {
        str(path.relative_to(PACKAGE)): hits
        for path in PACKAGE.rglob("*.py")
        if "processes" not in path.parts and (hits := probes(path.read_text()))
    }
    assert not found, f"ask the process through its capabilities instead: {found}"


@pytest.mark.parametrize(
    "make",
    [
        lambda: GaussianProcess(vocab_size=8, embed_dim=4),
        lambda: MaskedProcess(vocab_size=8, mask_id=7, eos_id=0),
        lambda: BlockProcess(vocab_size=8, mask_id=7, eos_id=0, block_size=2),
        lambda: AutoregressiveProcess(vocab_size=8, bos_id=0),
    ],
)
def test_every_process_answers_every_capability(make):
    process = make()
    assert isinstance(process, Process)
    for name in Process.__annotations__:
        getattr(process, name)  # declared with a default: no AttributeError
    assert process.continuous == (process.kind == "gaussian")
    assert (process.mask_id is not None) == (process.kind in ("masked", "block"))
    assert (process.block_size is not None) == (process.kind == "block")


def test_a_wrapper_forwards_calls_not_attributes():
    class Net(torch.nn.Module):
        def new_cache(self):
            return "cache"

    class Base(NetworkDenoiser):
        def __init__(self):
            self.network, self.secret = Net(), 1

    wrapped = WithLabel(Base(), torch.zeros(1, dtype=torch.long))
    assert isinstance(wrapped, Wrapper)
    assert wrapped.new_cache() == "cache" and wrapped.network_length(5) == 5
    assert wrapped.known_prefix() is None
    with pytest.raises(AttributeError):
        wrapped.network  # noqa: B018
    with pytest.raises(AttributeError):
        wrapped.secret  # noqa: B018


@pytest.mark.parametrize("kind", ["gaussian", "masked"])
def test_a_rows_hidden_score_does_not_depend_on_its_batch(kind):
    from cdlm.networks.transformer import Transformer

    torch.manual_seed(0)
    if kind == "gaussian":
        process = GaussianProcess(vocab_size=8, embed_dim=4)
    else:
        process = MaskedProcess(vocab_size=8, mask_id=7, eos_id=0)
    net = Transformer(**process.network_kwargs, d_model=16, n_layers=1, n_heads=2, max_seq_len=6)
    denoiser = process.make_denoiser(net.eval())
    ids = torch.randint(0, 7, (3, 6))
    hidden = torch.zeros_like(ids, dtype=torch.bool)
    hidden[0, 1], hidden[1, 2:4], hidden[2, 5] = True, True, True
    together = process.score_hidden(denoiser, ids, hidden)
    alone = torch.cat(
        [process.score_hidden(denoiser, ids[i : i + 1], hidden[i : i + 1]) for i in range(3)]
    )
    torch.testing.assert_close(together, alone, rtol=0, atol=1e-5)
