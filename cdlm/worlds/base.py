"""A world: a distribution over token sequences whose likelihood and posteriors are exact.

Every world here is a hidden Markov chain whose states each emit one token (``emit``): a state is
a token plus whatever the world must remember (the agreement world's declared name). The worlds
are unifilar (the tokens so far determine the state), so the entropy of the state path is the
entropy of the text. Given per-position evidence over tokens (an observed token, [MASK], a noisy
embedding's Gaussian likelihood), the scaled forward-backward algorithm (Rabiner 1989) gives
the exact posterior marginal of every position, and the forward pass alone the causal
predictive p(x_i | evidence before i). This is the oracle denoiser of Tang et al. (ICML 2026,
"Is Your Diffusion Sampler Actually Correct?"), for every corruption cdlm has.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from cdlm.worlds.reference import DenseReference, TransitionReference
from cdlm.worlds.transition import Transition, _entropy

NEVER = -1.0e4  # log-probability of a token the world never puts there: exp() is exactly 0


class ImpossibleObservation(ValueError):
    """The evidence rules out every state at some position (e.g. a token the world never emits)."""


class World:
    """A hidden chain over ``initial.numel()`` states.

    Args:
        name: how reports call it.
        tokenizer: a transformers tokenizer whose ids the states emit (pad, eos and mask among
            its special tokens; the world never emits them); None for a chain used only for
            inference over ``vocab_size`` ids (``cdlm.evaluation.oracle``).
        emit: (S,) the token id of each state.
        initial: (S,) the distribution of the first state.
        steps: the transitions into positions 1, 2, ...: position i uses ``steps[i % P]``
            (P = len(steps)), so periodic structure costs P matrices.
        length: the world's sequence length (training data, the entropy rate it reports).
        vocab_size: the ids evidence and posteriors range over; default the tokenizer's size.
    """

    def __init__(
        self,
        name: str,
        tokenizer,
        emit: Tensor,
        initial: Tensor,
        steps: list[Transition],
        length: int,
        vocab_size: int | None = None,
    ) -> None:
        if length < 1:
            raise ValueError(f"a world's length must be >= 1, got {length}")
        self.name, self.tokenizer, self.length = name, tokenizer, length
        self.emit, self.initial, self.steps = emit.long(), initial.double(), steps
        self.vocab_size = len(tokenizer) if vocab_size is None else vocab_size
        self.options: dict = {}  # the conf file's options it was built with (``worlds.load``)

    def step(self, i: int) -> Transition:
        """The transition into position i >= 1."""
        return self.steps[i % len(self.steps)]

    def describe(self) -> dict:
        """What a report says about the world."""
        return {
            "name": self.name,
            "length": self.length,
            "states": self.initial.numel(),
            "vocab": self.vocab_size,
            "entropy_rate_bits": self.entropy_rate() / math.log(2),
        } | ({"options": self.options} if self.options else {})

    # -- sampling and likelihood -------------------------------------------------------------

    @torch.no_grad()
    def sample(
        self, n: int, length: int | None = None, generator: torch.Generator | None = None
    ) -> Tensor:
        """(n, length) exact draws (token ids), float64 categorical draws, CPU."""
        length = self.length if length is None else length
        state = torch.multinomial(self.initial, n, replacement=True, generator=generator)
        states = [state]
        for i in range(1, length):
            state = self.step(i).sample(state, generator)
            states.append(state)
        return self.emit[torch.stack(states, 1)]

    @torch.no_grad()
    def log_prob(self, tokens: Tensor) -> Tensor:
        """(B,) exact log p(tokens) in nats, float64; -inf for a sequence the world never makes."""
        onehot = torch.full((*tokens.shape, self.vocab_size), -math.inf, dtype=torch.float64)
        onehot.scatter_(-1, tokens.cpu()[..., None], 0.0)
        return self._forward(onehot, strict=False, dtype=torch.float64)[2]

    def speaks(self, tokenizer, extra: tuple[str, ...] = ()) -> bool:
        """Whether ``tokenizer`` is this world's: the same vocabulary and special tokens (a model
        trained on the world, or a copy of its tokenizer), plus at most the ``extra`` tokens
        after the world's ids (e.g. the FIM sentinels an AR-FIM model adds, which no sample
        holds)."""
        own, vocab = self.tokenizer, tokenizer.get_vocab()
        own_vocab = own.get_vocab()
        specials = ("pad_token_id", "eos_token_id", "mask_token_id")
        added = {t: i for t, i in vocab.items() if t not in own_vocab}
        base = {t: i for t, i in vocab.items() if t not in added}
        return (
            base == own_vocab
            and set(added) <= set(extra)
            and all(i >= len(own) for i in added.values())
            and all(getattr(tokenizer, k) == getattr(own, k) for k in specials)
        )

    def violations(self, tokens: Tensor) -> Tensor:
        """(B,) bool: the sequences the world gives probability 0."""
        return torch.isinf(self.log_prob(tokens))

    def constraint_rate(self, tokens: Tensor) -> Tensor:
        """(B,) float64: the share of the world's constraints each sequence breaks; a world with
        none beyond its support has one, being possible (``cdlm-eval scorer=world`` reports it)."""
        return self.violations(tokens).double()

    # -- exact posteriors --------------------------------------------------------------------

    @torch.no_grad()
    def posterior(self, evidence: Tensor) -> Tensor:
        """(B, L, V) log p(x_i | all evidence) from per-position evidence log-likelihoods over
        tokens (B, L, V) (0 everywhere: nothing observed; -inf: ruled out). Float32 out."""
        like, _ = self._likelihood(evidence)
        alpha, _, _ = self._forward(evidence, like=like)
        beta = torch.ones_like(alpha)
        for i in range(alpha.shape[1] - 2, -1, -1):
            message = self.step(i + 1).pull(like[:, i + 1] * beta[:, i + 1])
            beta[:, i] = message / message.sum(-1, keepdim=True).clamp_min(
                torch.finfo(like.dtype).tiny
            )
        joint = alpha * beta
        total = joint.sum(-1, keepdim=True)
        if (total == 0).any():
            raise ImpossibleObservation(
                f"world {self.name}: the evidence is jointly impossible (each position alone is "
                "possible, together they are not)"
            )
        return self._tokens(joint / total, evidence.device)

    @torch.no_grad()
    def predictive(self, evidence: Tensor) -> Tensor:
        """(B, L, V) log p(x_i | evidence at positions < i): what a causal reader predicts."""
        _, pred, _ = self._forward(evidence)
        return self._tokens(pred, evidence.device)

    def _likelihood(
        self, evidence: Tensor, strict: bool = True, dtype: torch.dtype = torch.float32
    ) -> tuple[Tensor, Tensor]:
        """Per-state likelihoods (B, L, S), each position scaled to max 1, and the scales'
        logs (B, L). Posteriors are computed in float32 (every message is renormalised, so
        nothing underflows; probabilities to about 1e-7), likelihoods in float64."""
        ev = evidence.detach().to("cpu", dtype)[..., self.emit]
        top = ev.amax(-1)
        if strict and torch.isinf(top).any():
            b, i = (int(v) for v in torch.nonzero(torch.isinf(top))[0])
            raise ImpossibleObservation(
                f"world {self.name}: the evidence at position {i} (row {b}) rules out every "
                "token it can emit"
            )
        finite = torch.where(torch.isinf(top), torch.zeros_like(top), top)
        return (ev - finite[..., None]).exp(), finite

    def _forward(
        self,
        evidence: Tensor,
        like: Tensor | None = None,
        strict: bool = True,
        dtype: torch.dtype = torch.float32,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Scaled forward pass: filtered state marginals (B, L, S), predictive state marginals
        before each position's evidence (B, L, S), and log p(evidence) (B,) (float64)."""
        scale = None
        if like is None:
            like, scale = self._likelihood(evidence, strict, dtype)
        b, length, _ = like.shape
        alpha, pred = torch.empty_like(like), torch.empty_like(like)
        totals = torch.empty(b, length, dtype=like.dtype)
        message = self.initial.to(like.dtype).expand(b, -1)
        for i in range(length):
            if i > 0:
                message = self.step(i).push(alpha[:, i - 1])
            pred[:, i] = message
            joint = message * like[:, i]
            totals[:, i] = joint.sum(-1)
            alpha[:, i] = joint / totals[:, i, None].clamp_min(torch.finfo(like.dtype).tiny)
        log_z = totals.double().log().sum(-1)
        if scale is not None:
            log_z = log_z + scale.double().sum(-1)
        return alpha, pred, log_z

    def _tokens(self, states: Tensor, device: torch.device) -> Tensor:
        """State marginals (B, L, S) -> token log-marginals (B, L, V), float32, on ``device``."""
        out = torch.zeros(*states.shape[:-1], self.vocab_size, dtype=states.dtype)
        out.index_add_(-1, self.emit, states)
        return out.clamp_min(0).log().clamp_min(NEVER).float().to(device)

    # -- exact figures -----------------------------------------------------------------------

    def state_marginals(self, length: int | None = None) -> Tensor:
        """(L, S) the prior marginal of each position's state."""
        length = self.length if length is None else length
        m = [self.initial[None]]
        for i in range(1, length):
            m.append(self.step(i).push(m[-1]))
        return torch.cat(m)

    def entropy(self, length: int | None = None) -> float:
        """H(x_0..x_{L-1}) in nats: H(s_0) + sum_i E[H(s_i | s_{i-1})] (exact for a unifilar
        world, where the state path and the text determine each other)."""
        m = self.state_marginals(length)
        h = float(_entropy(self.initial))
        for i in range(1, m.shape[0]):
            h += float(m[i - 1] @ self.step(i).entropies())
        return h

    def entropy_rate(self, length: int | None = None) -> float:
        """Nats per token of sequences of ``length``: the mean NLL that exact samples have."""
        length = self.length if length is None else length
        return self.entropy(length) / length

    def token_marginals(self, length: int | None = None) -> Tensor:
        """(L, V) each position's prior token distribution."""
        m = self.state_marginals(length)
        out = torch.zeros(m.shape[0], self.vocab_size, dtype=torch.float64)
        return out.index_add_(-1, self.emit, m)

    def total_correlation(self, length: int | None = None) -> float:
        """sum_i H(x_i) - H(x) in nats: KL(world || product of its marginals), the excess NLL
        that a factorised model pays on exact samples (the factorisation floor). The other
        direction, a factorised sampler's KL to the world, is infinite where the world rules
        out combinations of possible tokens (the agreement world)."""
        return float(_entropy(self.token_marginals(length)).sum()) - self.entropy(length)

    def pair_table(self, length: int | None = None) -> Tensor:
        """(V, V) sum over i >= 1 of P(x_{i-1} = a, x_i = b): the transitions exact samples show,
        the reference of the transition-level KL and TV rates."""
        m = self.state_marginals(length)
        s, v = self.initial.numel(), self.vocab_size
        pairs = torch.zeros(v, v, dtype=torch.float64)
        states = torch.arange(s)
        for i in range(1, m.shape[0]):
            joint = m[i - 1][:, None] * self.step(i).rows(states)
            by_prev = torch.zeros(v, s, dtype=torch.float64).index_add_(0, self.emit, joint)
            pairs += torch.zeros(v, v, dtype=torch.float64).index_add_(1, self.emit, by_prev)
        return pairs

    def transition_reference(self, length: int | None = None) -> TransitionReference:
        """q(b | a): the pair table normalised per row (rows the world never visits: 0), dense
        (a chain answers from its own sparse transition instead: ``Chain``)."""
        pairs = self.pair_table(length)
        return DenseReference(pairs / pairs.sum(-1, keepdim=True).clamp_min(1e-300))
