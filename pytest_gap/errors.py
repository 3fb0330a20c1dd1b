"""Typed errors a user can cause. Each message is one line naming the input and the fix.

Also how text reaches a terminal or a log: `one_line` for messages, `shown` for any string a
peer sent (control characters escaped), `peer_text_escaped` for errors that quote one, and
`EscapedLogFormatter` for the servers' logs, whose lines quote peers everywhere.
"""

import contextlib
import logging
from collections.abc import Iterator

_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(char: str) -> str:
    code = ord(char)
    if char in _NAMED:
        return _NAMED[char]
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def shown(text: object) -> str:
    """`text` safe to print to a terminal or write to a log: every character a terminal acts on
    or a reader cannot see is escaped visibly (`\\x1b`, `\\n`, `\\u202e`), the rest as it is.

    Escaped: what Python's `str.isprintable` calls non-printable, as `repr` does: the C0 and C1
    controls and DEL (newlines, ANSI/ESC sequences that move the cursor or clear the screen),
    Unicode format characters (bidi overrides such as U+202E, zero-width ones), line and
    paragraph separators (U+2028/2029), spaces other than U+0020, lone surrogates, private-use
    and unassigned code points. For every string that arrives from the network (a worker's
    host, a server's error, a frame's field) before it reaches a terminal or a log: a peer must
    not forge lines, recolour or clear the screen, or reorder what is shown."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def one_line(text: object, limit: int = 120) -> str:
    """`text` on one line (runs of whitespace as one space, other control characters escaped
    as `shown` does), cut to `limit` with "..."."""
    flat = shown(" ".join(str(text).split()))
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class GapError(Exception):
    """Base class of every error pytest-gap raises on purpose."""


@contextlib.contextmanager
def peer_text_escaped() -> Iterator[None]:
    """Around code whose GapErrors may carry a peer's words (a server's refusal, a policy
    server's error): their messages are escaped as `shown` does before anyone prints them."""
    try:
        yield
    except GapError as exc:
        exc.args = tuple(shown_lines(a) if isinstance(a, str) else a for a in exc.args)
        raise


def shown_lines(text: object) -> str:
    """`text` escaped as `shown` does, line by line: its line breaks stay (a refusal lists one
    problem a line), nothing else a terminal acts on does. Whoever prints it labels each line
    (`gap: error: ` in cli/__init__.py), so no line of a peer's passes for one of ours."""
    return "\n".join(shown(line) for line in str(text).split("\n"))


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


class EscapedLogFormatter(logging.Formatter):
    """A log formatter that escapes each record's message as `shown` does, a line break too: a
    server's log quotes its peers (run ids, hosts, a policy server's errors, a task server's
    last line), and one record stays one line whatever they sent. A traceback the record
    carries is the process's own and is left as it is."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = shown(record.message)
        return super().formatMessage(record)
