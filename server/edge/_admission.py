"""Bounded concurrency: who may start a call or a stream now, and a fair worker pool.

The pool runs blocking work fairly between principals.

The model (ARCHITECTURE.md, "Process model"): the gRPC server runs on one
asyncio event loop; a unary call's blocking work (LMDB reads, FAISS, crypto,
waiting for the one writer) runs on a :class:`FairExecutor` of ``workers``
threads; a stream holds no thread while it waits (``Events.Watch`` sleeps on
the event notifier). Before any of that, :class:`Admission` counts what each
principal (one token) has open:

- calls in flight — admitted and not yet finished, whether running on a
  worker or waiting for one — at most ``max_inflight`` in all and
  ``max_inflight_per_principal`` per token, of which at most
  ``max_running_per_principal`` run at once;
- open streams, at most ``max_streams`` in all and
  ``max_streams_per_principal`` per token.

A token's first :data:`RESERVED_PER_PRINCIPAL` calls in flight are admitted
even when the server's bound is reached (up to twice that bound), so a burst
of a few heavy tokens that fills the server is refused its excess while a
light token's call still gets in.

Past a bound the call is refused at once with ``RESOURCE_EXHAUSTED``
(``TOO_MANY_REQUESTS`` / ``TOO_MANY_STREAMS``, with a ``RetryInfo``). The
per-principal bound is wide (256) on purpose: an admitted call waits in its
principal's queue, which costs the others at most one call (below), while a
refused client retries through the one event loop that every principal's
calls share (``bench/bench_overload.py``: another owner's ``Search`` p99 was
33.5x its floor beside 128 closed loops of one token bound at 16, 2.6x with
the excess queued, in a quiet run; under load grpc's accept queue, in arrival
order and before this module, dominates). The bounds are there for memory:
requests held per principal. Among the admitted calls the executor takes work from each principal
with waiting work in turn (round robin), so a principal with many calls
queued delays another principal's call by at most one call per principal, not
by its whole queue; and since Python threads share one interpreter lock, a
principal may run only ``max_running_per_principal`` calls at once while it
is alone, and one at a time while other principals have work (see
:meth:`FairExecutor._cap`), so another principal's call shares the CPU with
one of its calls, not with every worker, and the event loop that accepts
calls is not starved of the lock.

Thread rules: :class:`Admission` is used only on the event loop's thread (its
counters have no lock), except that the sweeper reads ``inflight`` (one int:
a stale value only delays one pause of the audit,
``server.lifecycle._pacing``); :class:`FairExecutor` ``submit`` from any thread.
"""

from __future__ import annotations

import collections
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from server import _steps
from server._metrics import Metrics
from server.errors import Overloaded, Reason

T = TypeVar("T")

_Item = tuple[Future[Any] | None, Callable[[], Any]]

CONTENDED_LINGER = 1.0
"""Seconds a principal still counts as having work after its last call finished
(:class:`FairExecutor`): a client sending one call after another is contending
between its calls too."""

RESERVED_PER_PRINCIPAL = 2
"""Calls in flight per token admitted past ``max_inflight`` (up to twice it)."""

SLOT_STALL = 0.05
"""Seconds with every running slot taken and none given back after which
:class:`FairExecutor` starts one more call anyway. The running bound is for
the CPU; it must never stop progress, and a call may wait while it holds a
slot in a way :func:`server._steps.blocking` does not mark."""


@dataclass(frozen=True)
class Limits:
    """The bounds of :class:`Admission` and the size of the worker pool.

    Attributes:
        workers: threads running blocking work of unary calls.
        max_running: of the calls on those threads, how many run at once, all
            principals (a call waiting for the writer or for an index build
            lends its slot: :func:`server._steps.blocking`).
        max_inflight: unary calls admitted at once, all principals.
        max_inflight_per_principal: unary calls admitted at once per token.
        max_running_per_principal: of those, calls of one token running at
            once (in effect at most ``max_running``).
        max_streams: open server streams (``Watch``), all principals.
        max_streams_per_principal: open streams per token.

    Raises:
        ValueError: a bound below 1, or a per-principal bound above its global one.
    """

    workers: int = 16
    max_running: int = 2
    max_inflight: int = 1024
    max_inflight_per_principal: int = 256
    max_running_per_principal: int = 4
    max_streams: int = 1024
    max_streams_per_principal: int = 128

    def __post_init__(self) -> None:
        for name in (
            "workers",
            "max_running",
            "max_inflight",
            "max_inflight_per_principal",
            "max_running_per_principal",
            "max_streams",
            "max_streams_per_principal",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.max_inflight_per_principal > self.max_inflight:
            raise ValueError("max_inflight_per_principal must not exceed max_inflight")
        if self.max_streams_per_principal > self.max_streams:
            raise ValueError("max_streams_per_principal must not exceed max_streams")


class Admission:
    """Counts calls and streams per principal and refuses past the bounds.

    Args:
        limits: the bounds.
        metrics: ``lethe_inflight_calls``, ``lethe_open_streams`` and
            ``lethe_refused_calls_total{reason}`` are kept here.
    """

    def __init__(self, limits: Limits, metrics: Metrics) -> None:
        self.limits = limits
        self._metrics = metrics
        self._calls: collections.Counter[str] = collections.Counter()
        self._streams: collections.Counter[str] = collections.Counter()
        self.inflight = 0
        self.streams = 0

    def enter_call(self, key: str) -> None:
        """Admit one unary call of principal ``key``; pair with :meth:`exit_call`.

        Raises:
            Overloaded: ``TOO_MANY_REQUESTS``, a bound is reached (nothing counted).
        """
        mine = self._calls[key]
        reserved = mine < RESERVED_PER_PRINCIPAL and self.inflight < 2 * self.limits.max_inflight
        if self.inflight >= self.limits.max_inflight and not reserved:
            self.refused(Reason.TOO_MANY_REQUESTS)
            raise Overloaded("the server has too many calls in flight; retry shortly")
        if mine >= self.limits.max_inflight_per_principal:
            self.refused(Reason.TOO_MANY_REQUESTS)
            raise Overloaded(
                f"this token has {self.limits.max_inflight_per_principal} calls in flight; "
                "retry when one finishes"
            )
        self._calls[key] += 1
        self.inflight += 1
        self._metrics.inflight_calls.set(self.inflight)

    def exit_call(self, key: str) -> None:
        """The call admitted by :meth:`enter_call` has finished (or was skipped)."""
        self._calls[key] -= 1
        if self._calls[key] <= 0:
            del self._calls[key]
        self.inflight -= 1
        self._metrics.inflight_calls.set(self.inflight)

    def enter_stream(self, key: str) -> None:
        """Admit one stream of principal ``key``; pair with :meth:`exit_stream`.

        Raises:
            Overloaded: ``TOO_MANY_STREAMS``, a bound is reached (nothing counted).
        """
        if self.streams >= self.limits.max_streams:
            self.refused(Reason.TOO_MANY_STREAMS)
            raise Overloaded(
                "the server has too many open streams",
                reason=Reason.TOO_MANY_STREAMS,
                retry_after=1.0,
            )
        if self._streams[key] >= self.limits.max_streams_per_principal:
            self.refused(Reason.TOO_MANY_STREAMS)
            raise Overloaded(
                f"this token has {self.limits.max_streams_per_principal} streams open; "
                "close one first",
                reason=Reason.TOO_MANY_STREAMS,
                retry_after=1.0,
            )
        self._streams[key] += 1
        self.streams += 1
        self._metrics.open_streams.set(self.streams)

    def exit_stream(self, key: str) -> None:
        """The stream admitted by :meth:`enter_stream` has ended."""
        self._streams[key] -= 1
        if self._streams[key] <= 0:
            del self._streams[key]
        self.streams -= 1
        self._metrics.open_streams.set(self.streams)

    def refused(self, reason: int) -> None:
        """Count one refusal under its ``ErrorReason`` name."""
        self._metrics.refused_calls.labels(Reason.Name(reason)).inc()  # type: ignore[arg-type]


class FairExecutor:
    """A pool of worker threads that serves principals in turn (round robin).

    It runs at most ``per_key`` items of one principal at once while that
    principal is the only one with work, one while several have.

    Each ``submit`` names a key (the principal); a worker takes the next item
    of the next key that has work and fewer than ``per_key`` items running,
    so work is interleaved across keys rather than first come, first served.
    The cap matters because Python threads share one interpreter lock: a call
    that gets a free worker beside many running calls of one principal still
    waits for the CPU, so what one principal may *run* at once is bounded, not
    only what it may queue. A cancelled future is skipped.

    Across principals, at most ``slots`` items run at once: more threads
    running Python at once share the same interpreter lock and only add
    switching (``bench/bench_processes.py --processes 1``: 16 clients' searches
    of a 20k owner, 360 a second and 3.4 ms of server CPU each with up to four
    running, 530 and 2.3 ms with two). A running item that waits lends its
    slot for the wait (:func:`server._steps.blocking`) and takes one again,
    before any new item, when it goes on; a long item at a step boundary
    (:func:`server._steps.step`) is parked while another principal waits for
    a slot. If every slot stays taken for :data:`SLOT_STALL` with none given
    back, one more item starts anyway.

    Args:
        workers: number of threads (started at once, daemonic).
        name: thread name prefix.
        per_key: most items of one key running at once while no other key has
            work (default: ``workers``; in effect at most ``slots``); one while
            others have.
        slots: most items running at once, all keys (default: ``workers``).
        stall: seconds after which one more item starts while every slot
            stays taken (:data:`SLOT_STALL`).
        on_stall: called (under the pool's lock; it must be quick) each time
            an item starts so, past ``slots``.
        on_depth: called with the number of items waiting (not running) each
            time it changes, from the thread that changed it.
    """

    def __init__(
        self,
        workers: int,
        name: str,
        *,
        per_key: int | None = None,
        on_depth: Callable[[int], None] | None = None,
        slots: int | None = None,
        stall: float = SLOT_STALL,
        on_stall: Callable[[], None] | None = None,
    ) -> None:
        mutex = threading.RLock()
        self._lock = threading.Condition(mutex)
        # Idle workers, the last to go idle on top: each waits on a condition of
        # its own, and work wakes the top one (its stack and caches are warm).
        self._idle: list[threading.Condition] = []
        self._waiter = _ThreadCondition(mutex)
        self._slot_freed = threading.Condition(mutex)  # calls back from a wait, here
        self._slots = slots or workers
        self._stall = stall
        self._on_stall = on_stall
        self.stalls = 0  # items started past the slots (a stall)
        self._cpu = 0  # items holding a running slot
        self._resuming = 0  # calls back from a wait, waiting for a slot (first served)
        self._last_free = time.monotonic()  # when a slot was last given back
        # Items: (future, work), or (None, wake) for a parked call's turn to resume.
        self._queues: dict[str, collections.deque[_Item]] = {}
        self._ring: collections.deque[str] = collections.deque()
        self._running: collections.Counter[str] = collections.Counter()
        self._per_key = per_key or workers
        self._idle_since: dict[str, float] = {}  # key -> when it last ran out of work
        self._depth = 0
        self._parked = 0
        self._closed = False
        self._on_depth = on_depth
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True)
            for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, key: str, fn: Callable[[], T]) -> Future[T]:
        """Queue ``fn`` for principal ``key``; its future resolves with its result.

        Raises:
            RuntimeError: the executor is shut down.
        """
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("executor is shut down")
            queue = self._queues.get(key)
            if queue is None:
                self._idle_since.pop(key, None)
                queue = self._queues[key] = collections.deque()
                self._ring.append(key)
            queue.append((future, fn))
            self._depth += 1
            depth = self._depth
            if self._cpu + self._resuming < self._slots:  # else a finishing call takes it
                self._wake_one()
        if self._on_depth is not None:
            self._on_depth(depth)
        return future

    @property
    def depth(self) -> int:
        """Items waiting for a worker."""
        return self._depth

    def shutdown(self, wait: bool = True) -> None:
        """Finish what is queued, then stop the threads (joined when ``wait``)."""
        with self._lock:
            self._closed = True
            while self._idle:
                self._idle.pop().notify()
        if wait:
            for thread in self._threads:
                thread.join()

    def _cap(self) -> int:
        """How many items one key may run at once now.

        ``per_key`` while one principal has work; one while several have
        (work queued or running, or finished less than :data:`CONTENDED_LINGER`
        ago). Python threads share one interpreter lock with the event loop
        that accepts every call: each call a flooding principal runs beside
        another principal's slows that call, and so does each one that starves
        the loop, which accepts calls in arrival order before this pool sees
        them (``bench/bench_overload.py``, flood: another owner's ``Search``
        p99 was 16-66x its floor with a share of 2 or 4 running, 0.7-3x with
        one, at 10 % less throughput for the flooding principal).
        """
        now = time.monotonic()
        for key, since in list(self._idle_since.items()):
            if now - since >= CONTENDED_LINGER:
                del self._idle_since[key]
        active = len(self._running.keys() | self._queues.keys() | self._idle_since.keys())
        return min(self._per_key, self._slots) if active <= 1 else 1

    def _stalled(self) -> bool:
        """Every slot taken and none given back for :data:`SLOT_STALL`: one more may start."""
        return time.monotonic() - self._last_free >= self._stall

    def _eligible(self) -> str | None:
        """The first key in the ring below its running cap (moved out of the ring).

        None while no running slot is free (calls back from a wait first).
        """
        if self._cpu + self._resuming >= self._slots and not self._stalled():
            return None
        cap = self._cap()
        for _ in range(len(self._ring)):
            key = self._ring.popleft()
            if self._running[key] < cap:
                return key
            self._ring.append(key)
        return None

    def _take(self) -> tuple[str, Future[Any] | None, Callable[[], Any]] | None:
        """The next item of the next eligible key (its running count raised); None once closed."""
        with self._lock:
            while True:
                key = self._eligible()
                if key is not None:
                    break
                if self._closed and not self._ring:
                    return None
                # A share grows back when a key lingers out; taken slots may stall.
                self._idle_wait(min(self._stall, 0.25) if self._ring else 0.25)
            self._take_slot()
            queue = self._queues[key]
            future, fn = queue.popleft()
            if queue:
                self._ring.append(key)
            else:
                del self._queues[key]
            self._running[key] += 1
            self._depth -= 1
            depth = self._depth
        if self._on_depth is not None:
            self._on_depth(depth)
        return key, future, fn

    def _idle_wait(self, timeout: float) -> None:
        """Wait as an idle worker (under the lock) until woken or ``timeout`` seconds pass.

        Only a worker that goes idle while no other is idle waits less than
        0.25 s (to notice a stall sooner); the others sleep on.
        """
        waiter = self._waiter.get()
        if self._idle:
            timeout = 0.25
        self._idle.append(waiter)
        try:
            waiter.wait(timeout)
        finally:
            if self._idle and self._idle[-1] is waiter:
                self._idle.pop()
            elif waiter in self._idle:
                self._idle.remove(waiter)

    def _wake_one(self) -> None:
        """Wake the worker that went idle last, if any (under the lock)."""
        if self._idle:
            self._idle.pop().notify()

    def _take_slot(self) -> None:
        """One more item running (under the lock); one started past a stall restarts its clock."""
        if self._cpu >= self._slots:
            self._last_free = time.monotonic()
            self.stalls += 1
            if self._on_stall is not None:
                self._on_stall()
        self._cpu += 1

    def _free_slot(self, *, taker: bool = False) -> None:
        """Give a running slot back (under the lock): to a call back from a wait first.

        Else an idle worker is woken for the queued work, unless ``taker``:
        the calling worker takes the next item itself (its item is done).
        """
        self._cpu -= 1
        self._last_free = time.monotonic()
        if self._resuming:
            self._slot_freed.notify()
        elif self._queues and not taker:
            self._wake_one()

    def _release(self) -> None:
        """A running call waits (:func:`server._steps.blocking`): its slot is lent meanwhile."""
        with self._lock:
            self._free_slot()

    def _resume(self) -> None:
        """A running call's wait is over: returns once it holds a slot again."""
        with self._lock:
            self._resuming += 1
            try:
                while self._cpu >= self._slots and not self._stalled():
                    self._slot_freed.wait(self._stall)
            finally:
                self._resuming -= 1
            self._take_slot()

    def _done(self, key: str) -> None:
        with self._lock:
            self._running[key] -= 1
            if self._running[key] <= 0:
                del self._running[key]
                if key not in self._queues:
                    self._idle_since[key] = time.monotonic()
            # This worker takes the next item itself (this key's or another's).
            self._free_slot(taker=True)

    def _run(self) -> None:
        while self._run_next():
            pass

    def _run_next(self) -> bool:
        """Run one item; False once the pool is shut down and drained.

        A method of its own so that nothing of the item (its future, result or
        error) stays referenced by the worker while it waits for the next one.
        """
        item = self._take()
        if item is None:
            return False
        key, future, fn = item
        if future is None:  # a parked call's turn: its running slot passes to it
            fn()
            return True
        try:
            if future.set_running_or_notify_cancel():
                _steps.bind(_CallSlot(self, key))
                try:
                    result = fn()
                except BaseException as exc:
                    release_frames(exc)
                    future.set_exception(exc)
                else:
                    future.set_result(result)
                finally:
                    _steps.bind(None)
        finally:
            self._done(key)
        return True

    def _park(self, key: str) -> None:
        """At a step boundary of ``key``'s running call (:func:`server._steps.step`).

        While ``key`` runs more calls than its share (:meth:`_cap`: others
        have work now), or every running slot is taken while another key
        waits for one, this call gives its running slot up and waits, its
        turn queued first in ``key``'s queue; it goes on when a worker takes
        that turn, as it would take ``key``'s next call. Otherwise it returns
        at once.
        """
        resumed = threading.Event()
        with self._lock:
            if self._closed:
                return
            cap = self._cap()
            if self._running[key] <= cap and not (
                self._cpu >= self._slots
                and any(k != key and self._running[k] < cap for k in self._ring)
            ):
                return
            self._running[key] -= 1  # 0 when it yields a slot rather than its share
            if self._running[key] <= 0:
                del self._running[key]
            self._free_slot()
            queue = self._queues.get(key)
            if queue is None:
                queue = self._queues[key] = collections.deque()
                self._ring.append(key)
            queue.appendleft((None, resumed.set))
            self._depth += 1
            self._parked += 1
            depth = self._depth
            self._wake_one()
        if self._on_depth is not None:
            self._on_depth(depth)
        resumed.wait()

    @property
    def parked(self) -> int:
        """How many times a running call has been parked at a step boundary, in all."""
        return self._parked


class _ThreadCondition:
    """A condition of the calling thread's own, on the pool's mutex (one per worker)."""

    def __init__(self, mutex: threading.RLock) -> None:
        self._mutex = mutex
        self._local = threading.local()

    def get(self) -> threading.Condition:
        waiter: threading.Condition | None = getattr(self._local, "waiter", None)
        if waiter is None:
            waiter = self._local.waiter = threading.Condition(self._mutex)
        return waiter


class _CallSlot:
    """The running call of ``key`` on ``pool``, as :mod:`server._steps` sees it."""

    __slots__ = ("key", "pool")

    def __init__(self, pool: FairExecutor, key: str) -> None:
        self.pool = pool
        self.key = key

    def step(self) -> None:
        self.pool._park(self.key)

    def release(self) -> None:
        self.pool._release()

    def resume(self) -> None:
        self.pool._resume()


def release_frames(exc: BaseException) -> None:
    """Drop the locals of the finished frames in the tracebacks of ``exc``, its cause and context.

    The tracebacks stay, for the log.

    The error goes on to the event loop as a value, where asyncio's and
    grpc.aio's futures and the abort chain keep it in reference cycles that
    only the cyclic GC frees; its frames would keep their locals alive as
    long. Among them are LMDB read transactions: a read that raises (a deleted
    or sealed record) leaves its ``txn`` in a frame, and py-lmdb only resets a
    finished read transaction, so under ``MDB_NOTLS`` its reader slot stays
    taken until the ``Transaction`` object is freed. The crash harness filled
    the 126 slots that way (``MDB_READERS_FULL``) before a full collection came
    round. Frames still running (the caller's own) are left alone.
    """
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        err = todo.pop()
        if id(err) in seen:
            continue
        seen.add(id(err))
        traceback.clear_frames(err.__traceback__)
        todo.extend(e for e in (err.__cause__, err.__context__) if e is not None)
        if isinstance(err, BaseExceptionGroup):
            todo.extend(err.exceptions)
