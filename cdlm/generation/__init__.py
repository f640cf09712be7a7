"""Running a sampler on a model: the plan of a run, the driver, the choice of sampler, the
inputs (layouts, labels), the per-sample records and the ``cdlm-sample`` session."""

from cdlm.generation.choice import (
    Choice,
    check_whole_canvases,
    choose,
    default_sampler,
    named_sampler,
    stops_at_eos,
    with_cache,
    with_temperature,
)
from cdlm.generation.generate import generate
from cdlm.generation.plan import DEFAULT_STEPS, ROUNDINGS, Generation, Plan, Sample, decode

__all__ = [
    "DEFAULT_STEPS",
    "ROUNDINGS",
    "Choice",
    "Generation",
    "Plan",
    "Sample",
    "check_whole_canvases",
    "choose",
    "decode",
    "default_sampler",
    "generate",
    "named_sampler",
    "stops_at_eos",
    "with_cache",
    "with_temperature",
]
