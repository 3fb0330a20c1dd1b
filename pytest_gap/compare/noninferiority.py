"""Is B worse than A by more than a margin? Paired binary outcomes (one pair per episode both
sides ran), tested two ways:

- `tango_p`: Tango's score test for matched pairs (Tango 1998, Statistics in Medicine 17), the
  fixed-n test: one-sided p-value for "B's success rate is below A's by more than `margin`".
  With margin 0 it is McNemar's z test.
- `log_e_worse` / `log_e_within`: anytime-valid e-values for the same question and for its
  converse ("B is within the margin of A, or better"), from a betting martingale on the pair
  differences D = B - A in {-1, 0, 1} (Waudby-Smith and Ramdas 2023, "Estimating means of
  bounded random variables by betting"). Each is an even mixture over fixed bets, so it depends
  on the counts alone, not on the order the pairs arrived in, and may be looked at after every
  block: under the null its value reaches 1/alpha with probability at most alpha, however often
  it is read (Ville's inequality).

Pure functions of counts: `a_only` pairs where only A succeeded (D = -1), `b_only` where only B
did (D = +1), `n` scored pairs in all.
"""

from __future__ import annotations

import math

# The bets of the mixture, as fractions of the largest bet that keeps every factor positive.
BETS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.8)


def tango_p(a_only: int, b_only: int, n: int, margin: float) -> float:
    """One-sided p-value of H0: p_B - p_A >= -margin against p_B - p_A < -margin."""
    if n == 0:
        return 1.0
    from scipy.stats import norm

    delta = margin
    # The discordant probabilities under H0's boundary (p_A_only = p_B_only + delta) that fit
    # the counts best: the positive root of 2n x^2 - b x - c = 0, x = P(B only).
    b = a_only * (1 - delta) + b_only * (1 - 3 * delta) - 2 * (n - a_only - b_only) * delta
    c = b_only * delta * (1 - delta)
    x = (b + math.sqrt(b * b + 8 * n * c)) / (4 * n)
    variance = (2 * x + delta - delta * delta) / n
    if variance <= 0:  # margin 0 and no discordant pair: nothing says B differs
        return 1.0
    z = ((b_only - a_only) / n + delta) / math.sqrt(variance)
    return float(norm.cdf(z))


def _log_mixture(logs: list[float]) -> float:
    top = max(logs)
    return top + math.log(sum(math.exp(v - top) for v in logs) / len(logs))


def log_e_worse(a_only: int, b_only: int, n: int, margin: float) -> float:
    """log e-value against "B is at most `margin` worse than A" (E[D] >= -margin): large when
    B is worse by more. Bets on D + margin being negative, at most 1/(1 + margin)."""
    same = n - a_only - b_only
    logs = []
    for bet in BETS:
        lam = bet / (1 + margin)
        logs.append(
            a_only * math.log1p(lam * (1 - margin))
            + same * math.log1p(-lam * margin)
            + b_only * math.log1p(-lam * (1 + margin))
        )
    return _log_mixture(logs)


def log_e_within(a_only: int, b_only: int, n: int, margin: float) -> float:
    """log e-value against "B is worse than A by `margin` or more" (E[D] <= -margin): large
    when B is within the margin of A, or better. Bets on D + margin being positive, at most
    1/(1 - margin)."""
    same = n - a_only - b_only
    logs = []
    for bet in BETS:
        lam = bet / (1 - margin)
        logs.append(
            a_only * math.log1p(-lam * (1 - margin))
            + same * math.log1p(lam * margin)
            + b_only * math.log1p(lam * (1 + margin))
        )
    return _log_mixture(logs)
