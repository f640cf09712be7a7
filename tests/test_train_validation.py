"""cdlm-train refuses config choices a process would silently ignore, before any work."""

import pytest

from cdlm.cli.train import validate
from cdlm.configs import compose_checked
from cdlm.validation import UsageError


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["process=masked", "schedule=sqrt"], "schedule= does not apply to process=MaskedProcess"),
        (["process=block", "schedule=linear"], "schedule= does not apply"),
        (["process=autoregressive", "schedule=sqrt"], "reads no schedule"),
        (["process=gaussian", "mask_schedule=cosine"], "mask_schedule= does not apply"),
        (["phases.ar=1.0"], r"phases.ar must be in \[0, 1\)"),
        (["phases.ar=0.6", "phases.anneal=0.6"], "shares of the budget"),
    ],
)
def test_ignored_or_impossible_choices_are_refused(overrides, message):
    with pytest.raises(UsageError, match=message):
        validate(compose_checked("train", overrides), overrides)


@pytest.mark.parametrize(
    "overrides",
    [
        ["process=masked", "mask_schedule=cosine", "trainer.max_steps=30"],
        ["process=gaussian", "schedule=sqrt", "trainer.max_steps=30"],
        ["process=autoregressive"],
    ],
)
def test_choices_that_fit_pass(overrides):
    validate(compose_checked("train", overrides), overrides)
