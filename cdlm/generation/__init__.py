"""Running a sampler on a model: the plan of a run, the driver, the choice of sampler, the
inputs (layouts, labels), batches of different prompts (rows), the per-sample records and the
``cdlm-sample`` session."""

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
from cdlm.generation.inputs import Row
from cdlm.generation.plan import DEFAULT_STEPS, ROUNDINGS, Generation, Plan, Sample, decode
from cdlm.generation.rows import RowSample, RowsGeneration, generate_rows

__all__ = [
    "DEFAULT_STEPS",
    "ROUNDINGS",
    "Choice",
    "Generation",
    "Plan",
    "Row",
    "RowSample",
    "RowsGeneration",
    "Sample",
    "check_whole_canvases",
    "choose",
    "decode",
    "default_sampler",
    "generate",
    "generate_rows",
    "named_sampler",
    "stops_at_eos",
    "with_cache",
    "with_temperature",
]
