"""SDTT of a block-diffusion teacher (issue 24, item 5): its target is the within-block two-step
distribution, each block given the true clean blocks before it (a stub teacher whose
log-probabilities depend on that past, where the distribution is worked out by hand); a tiny
block teacher distils end to end, and its students are sampled (and evaluated) by the block
sampler at their steps per block."""

import math
from types import SimpleNamespace

import torch

from cdlm.denoiser import Prediction
from cdlm.distillation import report
from cdlm.distillation.methods import SDTT
from cdlm.distillation.module import Distillation, student_of
from cdlm.distillation.report import RoundEval
from cdlm.distillation.targets import sdtt_target
from cdlm.generation import choose
from cdlm.networks.transformer import Transformer
from cdlm.processes.base import Corrupted
from cdlm.processes.block import BlockProcess

V, MASK, START = 5, 5, 6  # tokens 0..4, [MASK] = 5; START: the "past" of the first block
BLOCK, LENGTH = 2, 4


class PastAwareTeacher:
    """A block denoiser's whole-canvas call, stubbed: position i of block [a, a + 2) gets the
    log-probabilities F(past, r, i - a), a fixed table read at past = the clean token a - 1
    (START for the first block) and r = how many of its block's positions the canvas reveals.
    Like ``BlockDenoiser``, ``clean`` defaults to the canvas itself. Records each call's
    ``clean``."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.table = torch.randn(START + 1, BLOCK + 1, BLOCK, V, generator=g, dtype=torch.float64)
        self.cleans: list[torch.Tensor] = []

    def F(self, past: torch.Tensor, r: torch.Tensor, j: int) -> torch.Tensor:
        """(N, V + 1) SUBS log-probabilities: [MASK] impossible."""
        logp = torch.log_softmax(self.table[past, r, j], -1)
        return torch.cat([logp, torch.full_like(logp[..., :1], -math.inf)], -1)

    def __call__(self, z, t, self_cond=None, subs=True, *, clean=None, **kwargs) -> Prediction:
        clean = z if clean is None else clean
        self.cleans.append(clean.clone())
        out = []
        for i in range(z.shape[1]):
            a = i - i % BLOCK
            past = clean[:, a - 1] if a > 0 else torch.full_like(z[:, 0], START)
            r = (z[:, a : a + BLOCK] != MASK).sum(-1)
            out.append(self.F(past, r, i - a))
        return Prediction(logits=torch.stack(out, 1))


def test_sdtt_target_on_a_block_teacher_is_the_within_block_two_step_distribution():
    """Every block of 2 masked at t = 1, two teacher steps of 1/2 (reveal probability p at the
    first): position j of a block ends with F(past, 0, j) if it was revealed at the first step
    or nothing of its block was, and with F(past, 1, j) if only its block-mate was: probability
    (1 - p) p. The two positions of a block are never both late-with-mate. ``past`` is the true
    clean token before the block, not the canvas's (a [MASK] or the teacher's own draw)."""
    process = BlockProcess(vocab_size=V + 1, mask_id=MASK, block_size=BLOCK)
    n = 20_000
    tokens = torch.randint(0, V, (n, LENGTH), generator=torch.Generator().manual_seed(1))
    z = torch.full_like(tokens, MASK)
    c = Corrupted(tokens=tokens, x0=tokens, x_t=z, t=torch.ones(n), noisy=z == MASK)
    teacher = PastAwareTeacher()
    target = sdtt_target(teacher, process, c, 1.0, 0.5, 2, torch.Generator().manual_seed(0))
    assert len(teacher.cleans) == 2  # two whole-canvas calls: every block steps at once
    keep = process.schedule.keep
    p = float((keep(torch.tensor(0.5)) - keep(torch.tensor(1.0))) / (1 - keep(torch.tensor(1.0))))
    sigma = math.sqrt(p * (1 - p) * (1 - p * (1 - p)) / n)
    for a in range(0, LENGTH, BLOCK):
        past = tokens[:, a - 1] if a > 0 else torch.full((n,), START)
        late = []
        for j in range(BLOCK):
            early, with_mate = (teacher.F(past, torch.full((n,), r), j) for r in (0, 1))
            got = target[:, a + j]
            is_early, is_late = (got == early).all(-1), (got == with_mate).all(-1)
            assert bool((is_early | is_late).all()), f"block {a // BLOCK}: another past or state"
            assert abs(float(is_late.double().mean()) - (1 - p) * p) < 4 * sigma
            late.append(is_late)
        assert not bool((late[0] & late[1]).any())


def test_every_sdtt_call_on_a_block_model_reads_the_true_clean_stream():
    """Teacher and student alike: each call's clean stream is the batch's tokens, not the noisy
    canvas (the denoiser's default)."""
    process = BlockProcess(vocab_size=V + 1, mask_id=MASK, block_size=BLOCK)
    tokens = torch.randint(0, V, (8, LENGTH), generator=torch.Generator().manual_seed(2))
    teacher, student = PastAwareTeacher(), PastAwareTeacher()
    SDTT().loss(process, student, teacher, {"tokens": tokens}, 2, torch.Generator().manual_seed(0))
    assert len(teacher.cleans) == 2 and len(student.cleans) == 1
    for clean in teacher.cleans + student.cleans:
        assert torch.equal(clean, tokens)


TINY_NET = {"d_model": 16, "n_layers": 1, "n_heads": 2, "max_seq_len": 16}


def tiny_block_distillation(vocab_size: int, mask_id: int, round_eval=None, round_dir=None):
    torch.manual_seed(0)
    process = BlockProcess(vocab_size=vocab_size, mask_id=mask_id, block_size=BLOCK)
    teacher = Transformer(**TINY_NET, **process.network_kwargs)
    for p in teacher.parameters():
        p.data += 0.05 * torch.randn_like(p)
    process_config = {
        "_target_": "cdlm.processes.block.BlockProcess",
        "vocab_size": vocab_size,
        "mask_id": mask_id,
        "block_size": BLOCK,
    }
    network_config = {"_target_": "cdlm.networks.transformer.Transformer"} | TINY_NET
    config = {
        "process": process_config,
        "network": network_config | process.network_kwargs,
        "seq_len": 8,
        "labels": [],
    }
    module = Distillation(
        process,
        student_of(teacher.eval()),
        teacher,
        SDTT(),
        lambda p: torch.optim.AdamW(p, lr=1e-2),
        start_steps=4,
        end_steps=2,
        model_config=config,
        round_eval=round_eval,
        round_dir=round_dir,
    )
    return module, teacher


def test_a_block_teacher_distils_and_its_student_samples_with_the_block_sampler(
    tiny_corpus, tmp_path
):
    """The block teacher is accepted; two training steps change the student, not the teacher;
    the round's student records the block sampler at its steps per block, which is what
    cdlm-sample's choice then builds."""
    import lightning as L

    from cdlm.data import TextDataModule
    from cdlm.model_file import load_model

    data = TextDataModule(path=str(tiny_corpus), vocab_size=300, seq_len=8, batch_size=4)
    data.setup()
    module, teacher = tiny_block_distillation(
        data.vocab_size, data.tokenizer.mask_token_id, round_dir=str(tmp_path / "rounds")
    )
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    trainer = L.Trainer(
        max_steps=2,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, datamodule=data)
    for k, v in teacher.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert any(not torch.equal(v, before[k]) for k, v in module.network.state_dict().items())
    saved = load_model(tmp_path / "rounds" / "round1_2steps.safetensors")
    record = saved.config["distillation"]
    assert (record["method"], record["steps"], record["sampler"]) == ("sdtt", 2, "block")
    assert record["sampler_options"] == {"steps_per_block": 2}
    choice = choose(saved.process, saved.config, None, None)
    assert choice.name == "block" and choice.sampler.keywords["steps_per_block"] == 2
    assert "sampler.steps_per_block=2" in choice.note


def test_round_eval_samples_a_block_student_per_block_on_whole_canvases(tiny_corpus, monkeypatch):
    """The end-of-round check of a block student runs the block sampler at the student's steps
    per block (not the ancestral whole-canvas sampler, nor the run's steps shared out over the
    blocks) and fills whole canvases (no EOS stop: they are scored whole)."""
    from cdlm.data import TextDataModule

    data = TextDataModule(path=str(tiny_corpus), vocab_size=300, seq_len=8, batch_size=4)
    data.setup()
    module, _ = tiny_block_distillation(data.vocab_size, data.tokenizer.mask_token_id)
    seen = []
    real = report.generate

    def spy(model, sampler, plan):
        seen.append((sampler, plan.steps))
        return real(model, sampler, plan)

    monkeypatch.setattr(report, "generate", spy)
    host = SimpleNamespace(
        trainer=SimpleNamespace(datamodule=data),
        process=module.process,
        network=module.network,
        model_config=module.model_config,
    )
    out = RoundEval(num_samples=2, scorer="none")(host, module.steps)
    assert out["steps"] == 2.0 and out["entropy_bits"] > 0
    [(sampler, steps)] = seen
    assert steps == 2 and sampler.func.__name__ == "sample_block"
    assert sampler.keywords["steps_per_block"] == 2 and sampler.keywords["stop_at_eos"] is False
