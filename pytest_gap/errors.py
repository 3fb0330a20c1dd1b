"""Typed errors a user can cause. Each message is one line naming the input and the fix."""


def one_line(text: object, limit: int = 120) -> str:
    """`text` on one line (runs of whitespace as one space), cut to `limit` with "..."."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class GapError(Exception):
    """Base class of every error pytest-gap raises on purpose."""


class SimInputError(GapError, ValueError):
    """A suite, task, seed, family, variation or camera that does not exist."""


class RenderBackendError(GapError, RuntimeError):
    """No OpenGL backend could render MuJoCo cameras."""


class EpisodeError(GapError, RuntimeError):
    """The env was used outside an episode (step before reset, step after the step limit)."""


class VariationError(GapError, RuntimeError):
    """A generated family could not produce a valid layout (a generator bug, not user input)."""


class VideoError(GapError, RuntimeError):
    """An episode video could not be written."""


class InfraFailure(GapError, RuntimeError):
    """The harness's infrastructure failed (a policy server gone, a worker dead).

    A trial that hits one is recorded as an infrastructure failure, never scored as a bad policy.
    """
