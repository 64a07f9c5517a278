"""A random draw's share checked against the share it was drawn at, at one stated rate of false failures."""

from __future__ import annotations

from collections.abc import Sequence

# Within 5 standard deviations of the share: a draw that is right fails about 6e-7 of the time (5.7e-7 in the
# normal approximation, 6.0e-7 exactly for 2000 draws at 50 %), one check in 1.7 million.
SDS = 5


def assert_share(drawn: Sequence[bool], share: float) -> None:
    """``drawn`` (each draw: went to the side drawn at ``share`` or not) holds that side within ``SDS`` sd of it."""
    n = len(drawn)
    sd = (share * (1 - share) / n) ** 0.5
    assert abs(sum(drawn) / n - share) < SDS * sd, f"{sum(drawn)} of {n} drawn at {share}: more than {SDS} sd off"
