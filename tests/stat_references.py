"""Answers the harness's statistics must equal, computed from the definitions with scipy."""

from __future__ import annotations

import math

from scipy.optimize import minimize_scalar
from scipy.stats import norm


def tango_p_by_likelihood(a_only: int, b_only: int, n: int, margin: float) -> float:
    """Tango's score test of "B is worse than A by more than `margin`": its variance at the
    discordant rates that maximise the likelihood on the null's boundary (P(A only) = P(B only)
    + margin), found numerically rather than by the closed-form root the harness uses."""
    same = n - a_only - b_only

    def minus_log_likelihood(x):
        return -(
            a_only * math.log(x + margin)
            + b_only * math.log(x)
            + same * math.log(1 - 2 * x - margin)
        )

    bounds = (1e-12, (1 - margin) / 2 - 1e-12)
    x = minimize_scalar(
        minus_log_likelihood, bounds=bounds, method="bounded", options={"xatol": 1e-14}
    ).x
    z = ((b_only - a_only) / n + margin) / math.sqrt((2 * x + margin - margin**2) / n)
    return float(norm.cdf(z))
