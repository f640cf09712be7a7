"""Prompt→response training (``data.format=pairs``, issue 41): the rows and their masks, the
one-line errors of bad files, losses that score response tokens only (by hand, and by their
gradients: a prompt position's logits never move the loss), the prompt held as sampling holds
it, prompt dropout's rate and what a dropped prompt looks like, and cdlm-train end to end."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import TINY_TRAIN, run_main

from cdlm.data.datamodule import TextDataModule
from cdlm.data.pairs import Pair, encode_pairs
from cdlm.denoiser import Prediction
from cdlm.processes import (
    AutoregressiveProcess,
    BlockProcess,
    GaussianProcess,
    MaskedProcess,
    UniformProcess,
)
from cdlm.processes.curriculum import GaussianCurriculum
from cdlm.processes.prompts import drop_prompts
from cdlm.processes.uniform import uniform_nelbo

V, MASK = 8, 7
TOKENS = torch.tensor([[1, 2, 3, 4, 5, 6], [2, 3, 4, 5, 1, 0]])
PROMPT = torch.tensor([[1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0]], dtype=torch.bool)
VALID = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]], dtype=torch.bool)  # a PAD at the end
RESPONSE = VALID & ~PROMPT


def batch(rows: int = 1, **extra) -> dict[str, torch.Tensor]:
    """The two-row batch above, stacked ``rows`` times."""
    b = {"tokens": TOKENS, "valid": VALID, "prompt": PROMPT}
    return {k: v.repeat(rows, 1) for k, v in b.items()} | extra


class Spy:
    """A denoiser whose logits are one leaf tensor (so their gradient shows which positions the
    loss reads); records what it is shown."""

    def __init__(self, shape: tuple[int, int]) -> None:
        self.logits = torch.randn(*shape, V, generator=torch.Generator().manual_seed(1))
        self.logits.requires_grad_(True)
        self.seen: list[tuple[torch.Tensor, torch.Tensor | None]] = []

    def __call__(self, x, t=None, self_cond=None, **kw) -> Prediction:
        self.seen.append((x.detach().clone(), None if t is None else t.detach().clone()))
        return Prediction(logits=self.logits.log_softmax(-1))


def nll(spy: Spy, tokens: torch.Tensor) -> torch.Tensor:
    logp = spy.logits.detach().log_softmax(-1)
    return -logp.gather(-1, tokens[..., None]).squeeze(-1)


def touched(spy: Spy, loss: torch.Tensor) -> torch.Tensor:
    """(B, L): the positions whose logits the loss depends on."""
    (grad,) = torch.autograd.grad(loss, spy.logits)
    return grad.abs().sum(-1) > 0


# --- the losses ------------------------------------------------------------------------------


def spied_loss(process, rows: int):
    """``process.loss`` on ``rows`` copies of the batch under a ``Spy``; checks that the prompt
    reached the network clean. Returns (spy, out, x_t, t, tokens, prompt, response)."""
    spy = Spy((2 * rows, TOKENS.shape[1]))
    out = process.loss(spy, batch(rows), torch.Generator().manual_seed(0))
    z, t = spy.seen[0]
    prompt, response = PROMPT.repeat(rows, 1), RESPONSE.repeat(rows, 1)
    tokens = TOKENS.repeat(rows, 1)
    assert torch.equal(z[prompt], tokens[prompt])  # held clean
    return spy, out, z, t, tokens, prompt, response


def test_autoregressive_scores_the_response_tokens_only():
    process = AutoregressiveProcess(vocab_size=V, bos_id=0)
    spy = Spy(TOKENS.shape)
    out = process.loss(spy, batch())
    expected = (nll(spy, TOKENS) * RESPONSE).sum() / RESPONSE.sum()  # 7 response tokens
    torch.testing.assert_close(out.loss.detach(), expected)
    assert torch.equal(touched(spy, out.loss), RESPONSE)
    x, _ = spy.seen[0]  # the input is the clean row, shifted: the prompt is its left context
    assert torch.equal(x[:, 1:], TOKENS[:, :-1])


def test_masked_never_masks_the_prompt_and_scores_masked_response_tokens():
    process = MaskedProcess(vocab_size=V, mask_id=MASK, eos_id=0)
    spy, out, z, t, tokens, prompt, response = spied_loss(process, rows=32)
    masked = z == MASK
    assert masked[response].any() and not masked[prompt].any()
    weight = process.weight(t)[:, None]
    scored = masked & response
    expected = (weight * nll(spy, tokens) * scored).sum() / response.sum()
    torch.testing.assert_close(out.loss.detach(), expected)
    assert torch.equal(touched(spy, out.loss), scored)


def test_uniform_holds_the_prompt_clean_and_scores_every_response_token():
    """Uniform-state noise: the prompt is never resampled, and the ELBO integrand (which reads
    every position's logits, resampled or not) is summed over response tokens only."""
    process = UniformProcess(vocab_size=V)
    spy, out, z, t, tokens, prompt, response = spied_loss(process, rows=16)
    assert (z[response] != tokens[response]).any()  # the response is noised
    keep, dkeep = process.schedule.keep(t), process.schedule.dkeep(t)
    logp = spy.logits.detach().log_softmax(-1)
    per = uniform_nelbo(logp, z, tokens, keep, dkeep)
    expected = (per * response).sum() / response.sum()
    torch.testing.assert_close(out.loss.detach(), expected.float())
    assert torch.equal(touched(spy, out.loss), response)


def test_masked_dropout_shows_the_prompt_masked_and_still_does_not_score_it():
    process = MaskedProcess(vocab_size=V, mask_id=MASK, eos_id=0)
    spy = Spy(TOKENS.shape)
    dropped = torch.tensor([True, False])
    out = process.loss(spy, batch(prompt_dropped=dropped), torch.Generator().manual_seed(0))
    z, _ = spy.seen[0]
    assert (z[0][PROMPT[0]] == MASK).all()  # the unconditional input of prompt guidance
    assert torch.equal(z[1][PROMPT[1]], TOKENS[1][PROMPT[1]])
    assert not touched(spy, out.loss)[PROMPT].any()


class BlockSpy(Spy):
    """The two-stream calls of block diffusion: both streams' outputs are the spy's logits."""

    def streams(self, z, clean, **kw):
        self.seen.append((z.detach().clone(), None))
        return self.logits, self.logits

    def parameterize(self, out, z) -> Prediction:
        return Prediction(logits=out.log_softmax(-1))


def test_block_never_masks_the_prompt_in_either_complementary_half():
    process = BlockProcess(vocab_size=V, mask_id=MASK, eos_id=0, block_size=2, complementary=True)
    rows = 16
    spy = BlockSpy((4 * rows, TOKENS.shape[1]))  # the batch and its complement
    out = process.loss(spy, batch(rows), torch.Generator().manual_seed(0))
    z, _ = spy.seen[0]
    prompt, response = PROMPT.repeat(2 * rows, 1), RESPONSE.repeat(2 * rows, 1)
    assert torch.equal(z[prompt], TOKENS.repeat(2 * rows, 1)[prompt])
    masked = z == MASK
    assert masked[response].any() and not masked[prompt].any()
    assert torch.equal(touched(spy, out.loss), masked & response)


def test_gaussian_holds_the_prompt_as_sampling_does_and_scores_the_response():
    """A held prompt is the corruption's own alpha x0 + sigma eps at the row's level (what
    ``hold_fixed`` feeds at sampling): the same input as without a prompt, the same draws."""
    process = GaussianProcess(vocab_size=V, embed_dim=4)
    runs = {}
    for name, b in (("plain", {"tokens": TOKENS, "valid": VALID}), ("pairs", batch())):
        spy = Spy(TOKENS.shape)
        out = process.loss(spy, b, torch.Generator().manual_seed(0))
        runs[name] = (spy, out)
    (plain, _), (spy, out) = runs["plain"], runs["pairs"]
    assert torch.equal(spy.seen[0][0], plain.seen[0][0])
    assert torch.equal(spy.seen[0][1], plain.seen[0][1])
    expected = (nll(spy, TOKENS) * RESPONSE).sum() / RESPONSE.sum()
    torch.testing.assert_close(out.loss.detach(), expected)
    assert torch.equal(touched(spy, out.loss), RESPONSE)


def test_gaussian_dropout_shows_the_prompt_as_noise_at_level_one():
    process = GaussianProcess(vocab_size=V, embed_dim=4)
    seen = {}
    for dropped in (None, torch.tensor([True, False])):
        spy = Spy(TOKENS.shape)
        extra = {} if dropped is None else {"prompt_dropped": dropped}
        out = process.loss(spy, batch(**extra), torch.Generator().manual_seed(0))
        seen[dropped is None] = spy.seen[0]
    (x_held, t_held), (x, t) = seen[True], seen[False]
    assert t.shape == TOKENS.shape  # per-token levels, as Guided.unconditional passes them
    assert (t[0][PROMPT[0]] == 1).all()
    assert torch.equal(t[0][~PROMPT[0]], t_held[0].expand(int((~PROMPT[0]).sum())))
    assert torch.equal(t[1], t_held[1].expand(TOKENS.shape[1]))
    blanked = PROMPT & torch.tensor([[True], [False]])
    assert not torch.equal(x[blanked], x_held[blanked])  # a fresh draw there, the rest as held
    assert torch.equal(x[~blanked], x_held[~blanked])
    assert not touched(spy, out.loss)[PROMPT].any()


@pytest.mark.parametrize(
    "make",
    [
        lambda: AutoregressiveProcess(vocab_size=V, bos_id=0),
        lambda: MaskedProcess(vocab_size=V, mask_id=MASK, eos_id=0),
        lambda: GaussianProcess(vocab_size=V, embed_dim=4),
    ],
)
def test_an_empty_prompt_is_the_unconditional_loss(make):
    """The prompt path with no prompt positions draws nothing more and changes nothing."""
    process = make()
    plain = {"tokens": TOKENS, "valid": VALID}
    empty = plain | {"prompt": torch.zeros_like(PROMPT)}
    assert drop_prompts(plain, 0.5) is plain
    losses = [
        process.loss(Spy(TOKENS.shape), b, torch.Generator().manual_seed(3)).loss
        for b in (plain, empty)
    ]
    assert torch.equal(losses[0], losses[1])


def test_prompt_dropout_rate():
    n, p = 4000, 0.3
    b = {
        "tokens": torch.zeros(n, 4, dtype=torch.long),
        "prompt": torch.ones(n, 4, dtype=torch.bool),
    }
    rate = drop_prompts(b, p, torch.Generator().manual_seed(0))["prompt_dropped"].float().mean()
    assert abs(rate - p) < 4 * math.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize(
    ("make", "dropout", "message"),
    [
        (lambda: BlockProcess(vocab_size=V, mask_id=MASK, eos_id=0), 0.1, "process=block"),
        (lambda: UniformProcess(vocab_size=V), 0.1, "process=uniform"),
        (
            lambda: UniformProcess(vocab_size=V, curriculum=GaussianCurriculum(share=0.5)),
            0.0,
            "curriculum",
        ),
        (lambda: AutoregressiveProcess(vocab_size=V, bos_id=0), 0.1, "prompt guidance"),
    ],
)
def test_what_cannot_train_on_pairs_says_so(make, dropout, message):
    with pytest.raises(ValueError, match=message):
        make().check_prompts(dropout)


# --- the data --------------------------------------------------------------------------------

PAIRS = [
    {"prompt": "Who wrote Emma?", "response": "Jane Austen."},
    {"prompt": "Two and two?", "response": "Four."},
    {"prompt": "Say nothing.", "response": ""},
]


def write(path, lines) -> str:
    path.write_text("\n".join(json.dumps(x) if isinstance(x, dict) else x for x in lines))
    return str(path)


def test_three_pairs_give_rows_with_their_prompt_eos_and_padding(tmp_path):
    data = TextDataModule(write(tmp_path / "p.jsonl", PAIRS), seq_len=24, format="pairs")
    data.setup("fit")
    tok = data.tokenizer
    assert (len(data.train_set), len(data.val_set)) == (2, 1)  # the last pair held out
    items = [data.train_set[0], data.train_set[1], data.val_set[0]]
    for pair, item in zip(PAIRS, items, strict=True):
        ask = tok(pair["prompt"], add_special_tokens=False)["input_ids"]
        answer = tok(pair["response"], add_special_tokens=False)["input_ids"]
        end = len(ask) + len(answer) + 1
        row = ask + answer + [tok.eos_token_id] + [tok.pad_token_id] * (24 - end)
        assert item["tokens"].tolist() == row
        assert item["prompt"].tolist() == [i < len(ask) for i in range(24)]
        assert item["valid"].tolist() == [i < end for i in range(24)]  # its EOS counts, PAD not
    assert data.log_unigram()[tok.pad_token_id] == data.log_unigram().min()  # PAD not counted


def test_a_long_row_loses_the_start_of_its_prompt(tmp_path):
    data = TextDataModule(write(tmp_path / "p.jsonl", PAIRS), seq_len=24, format="pairs")
    data.setup("fit")
    tok = data.tokenizer
    ask = tok("Who wrote Emma? " * 5, add_special_tokens=False)["input_ids"]
    answer = tok("Jane Austen.", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    rows = encode_pairs(tok, [Pair("Who wrote Emma? " * 5, "Jane Austen.", 1)], 12)
    assert rows.tokens[0].tolist() == ask[-(12 - len(answer)) :] + answer
    assert rows.valid.all() and rows.prompt[0].sum() == 12 - len(answer)
    with pytest.raises(ValueError, match="line 7: the response"):
        encode_pairs(tok, [Pair("Hi", "Jane Austen. " * 10, 7)], 12)


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([PAIRS[0], {"prompt": "x"}], 'line 2: needs "prompt" and "response"'),
        ([PAIRS[0], "", "{not json"], "line 3: not JSON"),
        ([], "holds no prompt→response pairs"),
        ([{"messages": [{"role": "user", "content": "hi"}]}], 'line 1: "messages" needs'),
        ([{"prompt": "", "response": "x"}], "line 1: the prompt is empty"),
    ],
)
def test_a_bad_file_is_one_line_naming_the_line(tmp_path, lines, message):
    data = TextDataModule(write(tmp_path / "p.jsonl", lines), format="pairs")
    with pytest.raises(ValueError, match=message) as caught:
        data.setup("fit")
    assert "\n" not in str(caught.value)


def test_unknown_format_and_streamed_pairs_are_refused():
    with pytest.raises(ValueError, match="valid: text, pairs"):
        TextDataModule(format="chat")
    with pytest.raises(ValueError, match="streaming must be false"):
        TextDataModule(path="x.jsonl", format="pairs", streaming=True)


# --- cdlm-train ------------------------------------------------------------------------------


def sums(n: int = 40) -> list[dict]:
    return [{"prompt": f"{a}+{a % 7}=", "response": str(a + a % 7)} for a in range(n)]


@pytest.mark.parametrize("process", ["masked", "autoregressive", "gaussian", "block", "uniform"])
def test_cdlm_train_on_pairs(tmp_path, process):
    path = write(tmp_path / "sums.jsonl", sums())
    guided = process in ("masked", "gaussian")  # prompt dropout trains for prompt guidance
    extra = ["condition.prompt_dropout=0.5"] if guided else []
    result = run_main(
        "cdlm-train",
        f"process={process}",
        "data.format=pairs",
        f"data.path={path}",
        *TINY_TRAIN,
        *extra,
        "+trainer.enable_progress_bar=false",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "run" / "model.safetensors").is_file()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["data.format=pairs", "process=uniform", "condition.prompt_dropout=0.1"],
            "not supported by process=uniform",
        ),
        (["process=masked", "condition.prompt_dropout=0.1"], "prompt_dropout applies to"),
    ],
)
def test_cdlm_train_refuses_in_one_line(tmp_path, args, message):
    path = write(tmp_path / "sums.jsonl", sums())
    result = run_main(
        "cdlm-train",
        f"data.path={path}",
        *TINY_TRAIN,
        *args,
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert any(message in line for line in result.stderr.splitlines()), result.stderr[-2000:]
