"""The one event notifier behind every ``Events.Watch`` stream.

The store calls :meth:`EventHub.notify_threadsafe` on its writer thread after
each commit that appended events, with the owners they belong to
(:meth:`server.store.Store.on_events`); the hub wakes, on the event loop, the
streams watching those owners. A stream subscribes before its first read and
clears its wake-up flag before each read, so an event committed while it
reads wakes it again: no event waits for a timer, and no stream polls.

Thread rules: :meth:`EventHub.notify_threadsafe` from any thread; everything
else on the event loop's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable


class Subscription:
    """One stream's interest in one owner's events; ``wake`` is set on news."""

    def __init__(self, hub: EventHub, owner: str, wake: asyncio.Event) -> None:
        self._hub = hub
        self.owner = owner
        self.wake = wake

    def close(self) -> None:
        """Stop waking this stream (idempotent)."""
        self._hub._drop(self)


class EventHub:
    """Fans commits out to the streams watching each owner.

    Args:
        loop: the event loop the streams run on.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._subs: dict[str, set[Subscription]] = {}
        self.notified = 0
        """Owners announced so far (for tests and metrics)."""

    def subscribe(self, owner: str, wake: asyncio.Event) -> Subscription:
        """Set ``wake`` whenever events of ``owner`` are committed."""
        sub = Subscription(self, owner, wake)
        self._subs.setdefault(owner, set()).add(sub)
        return sub

    def notify_threadsafe(self, owners: Iterable[str]) -> None:
        """Announce committed events of ``owners``; callable from any thread."""
        batch = frozenset(owners)
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody watches any more
            self._loop.call_soon_threadsafe(self._notify, batch)

    def _notify(self, owners: frozenset[str]) -> None:
        self.notified += len(owners)
        for owner in owners:
            for sub in self._subs.get(owner, ()):
                sub.wake.set()

    def _drop(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.owner)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._subs[sub.owner]

    @property
    def streams(self) -> int:
        """Subscriptions open now."""
        return sum(len(s) for s in self._subs.values())
