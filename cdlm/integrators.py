"""The scipy ``solve_ivp`` methods that cdlm's probability-flow ODE solves accept (sampling in
``cdlm.samplers.adaptive``, likelihood in ``cdlm.likelihood.ode``): explicit Runge-Kutta pairs,
whose accepted steps each end with an evaluation at the new time, so NFE counts are exact."""

from __future__ import annotations

METHODS = ("RK23", "RK45", "DOP853")


def check_method(method: str) -> None:
    """Raises ValueError naming the valid methods if ``method`` is not one of them."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; valid: {', '.join(METHODS)}")
