"""Logging that no caller can grow without bound.

Lines about what a client sent — undecodable requests, refused tokens,
overload refusals, internal errors — go through :data:`LIMITED`, which lets
at most ``burst`` lines of each kind through per ``window`` seconds (a token
bucket per kind) and counts the rest; the next line of that kind that gets
through says how many were suppressed. So an unauthenticated client sending
garbage as fast as it can adds at most ``burst`` lines per window per kind.

Thread rules: :meth:`RateLimitedLog.log` from any thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable


class RateLimitedLog:
    """At most ``burst`` lines per kind per ``window`` seconds.

    Args:
        logger: where lines go.
        burst: lines of one kind let through back to back.
        window: seconds to earn back a full burst (one line per
            ``window / burst`` seconds on average).
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        logger: logging.Logger,
        *,
        burst: int = 5,
        window: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._burst = float(burst)
        self._rate = burst / window
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float, int]] = {}

    def log(self, level: int, kind: str, message: str, *args: object) -> bool:
        """Log ``message % args`` at ``level`` unless ``kind`` is over its budget.

        Returns:
            Whether the line was written.
        """
        now = self._clock()
        with self._lock:
            tokens, last, suppressed = self._buckets.get(kind, (self._burst, now, 0))
            tokens = min(self._burst, tokens + (now - last) * self._rate)
            if tokens < 1.0:
                self._buckets[kind] = (tokens, now, suppressed + 1)
                return False
            self._buckets[kind] = (tokens - 1.0, now, 0)
        if suppressed:
            message += " (%d more of this kind suppressed)"
            args = (*args, suppressed)
        self._logger.log(level, message, *args)
        return True


LIMITED = RateLimitedLog(logging.getLogger("server"))
"""The server's rate-limited log (kinds: ``malformed``, ``unauthenticated``,
``refused``, ``internal``, ``index_build``)."""
