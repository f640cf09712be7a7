"""Reading model files written before the process seams (cdlm < 0.2): their process configs
used flags (``objective: "ce"``, ``readout_skip``, ``posterior_input``, ``shift``,
``self_cond_prob``) and step counts (``ar_steps``, ``anneal_steps``, ``ramp_steps``) that are
now composable pieces and training callbacks. ``upgrade`` rewrites such a config and its
weights' names so that old checkpoints keep loading; new files pass through unchanged."""

from __future__ import annotations

from typing import Any

from torch import Tensor

PIECES = "cdlm.processes.parameterization"
OBJECTIVES = "cdlm.processes.objectives"
TRAINING_ONLY = ("ar_steps", "anneal_steps")  # now cdlm.training.phases (shares of a budget)


def upgrade_process(config: dict[str, Any]) -> dict[str, Any]:
    """The process config in today's form."""
    config = {k: v for k, v in config.items() if k not in TRAINING_ONLY}
    sampler = config.get("time_sampler")
    if isinstance(sampler, dict) and "ramp_steps" in sampler:
        sampler = {k: v for k, v in sampler.items() if k != "ramp_steps"}  # sampling ignores it
        config["time_sampler"] = sampler
    if not config.get("_target_", "").endswith("GaussianProcess"):
        return config
    if not isinstance(config.get("objective", "ce"), str) and "readout_skip" not in config:
        return config  # already today's form
    objective = config.pop("objective", "ce")
    readout_skip = config.pop("readout_skip", False)
    posterior, shift = config.pop("posterior_input", False), config.pop("shift", False)
    self_cond = config.pop("self_cond_prob", 0.5)
    config["objective"] = (
        {"_target_": f"{OBJECTIVES}.CrossEntropy", "readout_skip": readout_skip}
        if objective == "ce"
        else {"_target_": f"{OBJECTIVES}.X0MSE"}
    )
    config["input"] = (
        {"_target_": f"{PIECES}.PosteriorInput", "shift": shift}
        if posterior
        else {"_target_": f"{PIECES}.VectorInput", "self_cond_prob": self_cond}
    )
    return config


def upgrade_state(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Drops the batch counters that training state used to keep inside the model."""
    stale = ("process.step", "process.time_sampler.step")
    return {k: v for k, v in state.items() if k not in stale}
