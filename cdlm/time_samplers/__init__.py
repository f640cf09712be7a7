"""Where training spends its noise levels: distributions over the training time t in [0, 1].

Every process's loss is an expectation over t, and on a short budget the draw of t decides what
the network learns first. Low noise is easy for embedding diffusion (a token's own noisy
embedding gives it away) and high mask rates teach a masked model little beyond unigram
frequencies, so the levers here move training towards the levels where context matters.
Validation always uses the uniform stratified draw, so the reported bound does not depend on the
sampler chosen for training.

A time sampler is a small ``nn.Module`` (its state is in buffers, so it is saved with the model
and resumes with it): ``sampler(n, device, generator) -> (n,)`` draws times in training and
changes nothing; ``observe(t, loss)`` lets learned samplers see the per-sequence losses of those
times, and ``set_progress(p)`` tells schedules over training how far the budget has gone (both
called explicitly, by the training module and ``cdlm.training.phases.Phases``).
Samplers with a known ``density(t)`` let a process importance-weight its loss by 1 / density,
which keeps the uniform-t objective (and, for a bound, its value) unbiased under the proposal,
if it draws every level (``covers_all_levels``; ``Clipped`` does not).

Modules: ``base`` (the contract, stratified times), ``shaped`` (logit-normal, bell, clipped),
``curriculum`` (a range rising over the budget), ``learned`` (CDCD warping, log-SNR Gumbel).
"""

from cdlm.time_samplers.base import (
    Stratified,
    TimeSampler,
    bounded_times,
    check_reweightable,
    stratified_normal,
    stratified_times,
)
from cdlm.time_samplers.curriculum import Curriculum
from cdlm.time_samplers.learned import LogSNRGumbel, Warped
from cdlm.time_samplers.shaped import Bell, Clipped, LogitNormal

__all__ = [
    "Bell",
    "Clipped",
    "Curriculum",
    "LogSNRGumbel",
    "LogitNormal",
    "Stratified",
    "TimeSampler",
    "Warped",
    "bounded_times",
    "check_reweightable",
    "stratified_normal",
    "stratified_times",
]
