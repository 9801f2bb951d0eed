"""The pieces of bounded concurrency on their own: fair pool, bounds' validation, rate-limited log.

That is the fair worker pool, the validation of the bounds, and the
rate-limited log.
"""

from __future__ import annotations

import functools
import gc
import logging
import threading
import time
import traceback
import weakref
from collections.abc import Callable

import pytest

from server._logs import RateLimitedLog
from server._metrics import Metrics
from server.edge import Admission, FairExecutor, Limits
from server.edge._admission import CONTENDED_LINGER
from server.errors import Overloaded


def test_fair_executor_serves_principals_in_turn() -> None:
    release, running = threading.Event(), threading.Event()
    order: list[str] = []
    pool = FairExecutor(1, "test")
    try:

        def block() -> None:
            running.set()
            release.wait(10)

        blocker = pool.submit("x", block)
        assert running.wait(5)
        futures = [pool.submit("alice", functools.partial(order.append, f"a{i}")) for i in range(4)]
        futures.append(pool.submit("bob", lambda: order.append("b0")))
        futures.append(pool.submit("carol", lambda: order.append("c0")))
        assert pool.depth == 6
        release.set()
        blocker.result(timeout=5)
        for f in futures:
            f.result(timeout=5)
    finally:
        release.set()
        pool.shutdown()
    # Alice queued four before Bob and Carol queued one each: they wait for
    # one of hers, not for all four.
    assert order == ["a0", "b0", "c0", "a1", "a2", "a3"]
    assert pool.depth == 0


def test_fair_executor_caps_what_one_key_runs_at_once() -> None:
    release = threading.Event()
    started = threading.Semaphore(0)
    order: list[str] = []

    def hold(tag: str) -> None:
        order.append(tag)
        started.release()
        release.wait(10)

    pool = FairExecutor(3, "test", per_key=1)
    try:
        a = [pool.submit("alice", functools.partial(hold, f"a{i}")) for i in range(3)]
        b = pool.submit("bob", functools.partial(hold, "b0"))
        for _ in range(2):
            assert started.acquire(timeout=5)
        assert not started.acquire(timeout=0.2)  # a third worker is idle, alice is capped
        assert sorted(order) == ["a0", "b0"]
        release.set()
        for f in [*a, b]:
            f.result(timeout=5)
    finally:
        release.set()
        pool.shutdown()
    assert order[2:] == ["a1", "a2"]


def test_a_second_principal_shrinks_the_first_ones_running_share() -> None:
    """While another principal has work, one with a long queue runs one call at a time.

    The other's call then shares the interpreter lock (and the event loop that
    accepts every call) with one of its calls. The other still counts for
    ``CONTENDED_LINGER`` after its call finished (a client sending one call after
    another); then the first gets its whole ``per_key`` back.
    """
    gates = {f"a{i}": threading.Event() for i in range(10)} | {"b0": threading.Event()}
    started: list[str] = []
    lock = threading.Lock()

    def hold(tag: str) -> None:
        with lock:
            started.append(tag)
        gates[tag].wait(10)

    def running() -> list[str]:
        with lock:
            return [t for t in started if not gates[t].is_set()]

    def settle() -> None:
        time.sleep(0.2)

    pool = FairExecutor(8, "test", per_key=4)
    try:
        futures = [pool.submit("alice", functools.partial(hold, f"a{i}")) for i in range(10)]
        settle()
        assert running() == ["a0", "a1", "a2", "a3"]  # alone: per_key
        futures.append(pool.submit("bob", functools.partial(hold, "b0")))
        settle()
        assert "b0" in running()  # at once: a worker was free
        for tag in ("a0", "a1", "a2"):
            gates[tag].set()
        settle()
        # Two active principals: alice runs one call at a time, no new one of hers started.
        assert sorted(t for t in running() if t.startswith("a")) == ["a3"]
        gates["a3"].set()
        settle()
        assert sorted(t for t in running() if t.startswith("a")) == ["a4"]  # one, in turn
        gates["b0"].set()
        settle()
        # bob finished, but still counts for CONTENDED_LINGER: alice stays at one...
        assert len([t for t in running() if t.startswith("a")]) == 1
        time.sleep(CONTENDED_LINGER + 0.3)
        assert len([t for t in running() if t.startswith("a")]) == 4  # ...then alone again
        for gate in gates.values():
            gate.set()
        for f in futures:
            f.result(timeout=5)
    finally:
        for gate in gates.values():
            gate.set()
        pool.shutdown()


def test_fair_executor_skips_cancelled_work_and_passes_exceptions() -> None:
    release = threading.Event()
    ran: list[int] = []
    pool = FairExecutor(1, "test")
    try:
        pool.submit("x", lambda: release.wait(10))
        skipped = pool.submit("a", lambda: ran.append(1))
        failing = pool.submit("a", lambda: 1 // 0)
        assert skipped.cancel()
        release.set()
        with pytest.raises(ZeroDivisionError):
            failing.result(timeout=5)
    finally:
        release.set()
        pool.shutdown()
    assert ran == []
    with pytest.raises(RuntimeError):
        pool.submit("a", lambda: None)


class _Held:
    """Stands for an LMDB read transaction: what a failing call's frames hold."""


def test_fair_executor_frees_the_locals_of_a_failed_call() -> None:
    """A failed call's error keeps its traceback, but the locals of its frames are freed at once.

    The error reaches its caller with its traceback, but the locals of its
    frames (an LMDB read transaction keeps a reader slot until freed) are gone
    at once, not when the cyclic GC frees the error, and the worker keeps
    nothing of the call either.
    """
    held: list[weakref.ref[_Held]] = []

    def inner() -> None:
        txn = _Held()
        held.append(weakref.ref(txn))
        raise LookupError("deleted")

    def outer() -> None:
        txn = _Held()
        held.append(weakref.ref(txn))
        try:
            inner()
        except LookupError:
            raise ValueError("aborted")  # noqa: B904 -- an error raised while handling another

    pool = FairExecutor(1, "test")
    gc.disable()
    try:
        future = pool.submit("a", outer)
        err = future.exception(timeout=5)
        assert isinstance(err, ValueError)
        assert isinstance(err.__context__, LookupError)
        assert len(held) == 2
        assert [ref() for ref in held] == [None, None]
        tb = "".join(traceback.format_exception(err))
        assert "in outer" in tb  # the log still says where
        assert "in inner" in tb
        del future, err
        held.clear()

        def make() -> _Held:
            obj = _Held()
            held.append(weakref.ref(obj))
            return obj

        # What the worker ran last is not kept while it waits for more work.
        pool.submit("a", make).result(timeout=5)
        deadline = time.monotonic() + 5
        while held[0]() is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert held[0]() is None
    finally:
        gc.enable()
        pool.shutdown()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"workers": 0},
        {"max_inflight": 0},
        {"max_inflight": 4, "max_inflight_per_principal": 8},
        {"max_streams": 4, "max_streams_per_principal": 8},
    ],
)
def test_limits_refuse_nonsense(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="must"):
        Limits(**kwargs)


def test_admission_counts_per_principal_and_in_all() -> None:
    metrics = Metrics()
    adm = Admission(Limits(max_inflight=4, max_inflight_per_principal=3), metrics)
    for _ in range(3):
        adm.enter_call("a")
    with pytest.raises(Overloaded, match="this token") as per_token:
        adm.enter_call("a")
    assert per_token.value.reason_name == "TOO_MANY_REQUESTS"
    adm.enter_call("b")  # the server's bound is reached (4)
    adm.enter_call("b")  # b's first two calls are reserved: admitted past it
    with pytest.raises(Overloaded, match="the server"):
        adm.enter_call("b")  # a third is not
    for light in "cde":
        adm.enter_call(light)  # light tokens still get in...
    assert adm.inflight == 8
    with pytest.raises(Overloaded, match="the server"):
        adm.enter_call("f")  # ...up to twice the server's bound
    adm.exit_call("a")
    adm.enter_call("f")
    assert metrics.registry.get_sample_value("lethe_inflight_calls") == 8
    assert (
        metrics.registry.get_sample_value(
            "lethe_refused_calls_total", {"reason": "TOO_MANY_REQUESTS"}
        )
        == 3
    )


def test_rate_limited_log_lets_a_burst_through_then_counts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    log = RateLimitedLog(
        logging.getLogger("test.limited"), burst=3, window=30.0, clock=lambda: now[0]
    )
    with caplog.at_level(logging.WARNING, logger="test.limited"):
        written = [log.log(logging.WARNING, "k", "line %d", i) for i in range(100)]
        assert written.count(True) == 3
        assert log.log(logging.WARNING, "other", "another kind")  # kinds are separate
        now[0] += 10.0  # one line earned back (3 per 30 s)
        assert log.log(logging.WARNING, "k", "later")
        assert not log.log(logging.WARNING, "k", "too soon")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "line 0",
        "line 1",
        "line 2",
        "another kind",
        "later (97 more of this kind suppressed)",
    ]


def test_default_bounds_queue_a_flooding_token_instead_of_refusing_it() -> None:
    """128 closed loops of one token are admitted (and queued), not refused.

    With the old defaults (16 per token) 112 of them were refused, and their
    retries went through the event loop every other token shares:
    another owner's Search p99 was 33.5x its floor in bench/bench_overload.py.
    """
    admission = Admission(Limits(), Metrics())
    for _ in range(128):
        admission.enter_call("flooding")
    admission.enter_call("other")
    assert admission.inflight == 129
    for _ in range(256 - 128):
        admission.enter_call("flooding")
    with pytest.raises(Overloaded, match="256 calls in flight"):
        admission.enter_call("flooding")


def test_a_long_call_parks_at_a_step_while_its_principal_is_over_its_share() -> None:
    """Running calls of a principal over its share stop at their next step until their turn.

    Alice's three long calls started while she was alone (per_key 4); once bob
    has work her share is one, so at their next ``step`` two of them park
    (their workers wait, their slots free) and one goes on. Bob's call runs at
    once. With bob gone and lingered out, the parked calls go on.
    """
    from server._steps import step

    stop = threading.Event()
    steps: dict[str, int] = {f"a{i}": 0 for i in range(3)}
    lock = threading.Lock()

    def long_call(tag: str) -> str:
        while not stop.is_set():
            with lock:
                steps[tag] += 1
            time.sleep(0.005)
            step()
        return tag

    def advancing() -> set[str]:
        with lock:
            before = dict(steps)
        time.sleep(0.3)
        with lock:
            return {t for t in steps if steps[t] > before[t]}

    pool = FairExecutor(8, "test", per_key=4)
    try:
        futures = [pool.submit("alice", functools.partial(long_call, f"a{i}")) for i in range(3)]
        assert advancing() == {"a0", "a1", "a2"}  # alone: all three run
        bob_done = threading.Event()
        bob = pool.submit("bob", lambda: bob_done.wait(10))
        time.sleep(0.1)
        assert len(advancing()) == 1  # two parked at their next step
        assert pool.parked >= 2
        bob_done.set()
        bob.result(timeout=5)
        time.sleep(CONTENDED_LINGER + 0.2)
        assert advancing() == {"a0", "a1", "a2"}  # bob gone: all three again
        stop.set()
        assert sorted(f.result(timeout=5) for f in futures) == ["a0", "a1", "a2"]
    finally:
        stop.set()
        pool.shutdown()


def test_step_outside_the_pool_does_nothing() -> None:
    from server._steps import step

    step()  # no pool bound on this thread: returns at once


def _concurrency_probe() -> tuple[Callable[[float], None], list[int]]:
    """A call that runs ``seconds`` and records how many such calls ran at once (the peak)."""
    lock = threading.Lock()
    now = [0]
    peak = [0]

    def call(seconds: float) -> None:
        with lock:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
        time.sleep(seconds)
        with lock:
            now[0] -= 1

    return call, peak


def test_the_pool_runs_at_most_slots_calls_at_once_whoever_they_are() -> None:
    """Eight principals with a call each, eight workers, two slots: never more than two run."""
    call, peak = _concurrency_probe()
    pool = FairExecutor(8, "test", slots=2, stall=30.0)
    try:
        futures = [pool.submit(f"p{i}", functools.partial(call, 0.03)) for i in range(8)]
        for f in futures:
            f.result(timeout=10)
    finally:
        pool.shutdown()
    assert peak[0] == 2


def test_a_call_waiting_in_blocking_lends_its_slot_and_takes_one_back_first() -> None:
    """One slot: alice waits (marked) while bob runs in her slot; back, she goes before carol.

    Carol's call was queued while bob ran: when bob finishes, the slot goes to
    alice (back from her wait) before carol's new call starts.
    """
    from server._steps import blocking

    order: list[str] = []
    waiting, go, bob_running, bob_go = (threading.Event() for _ in range(4))

    def alice() -> None:
        with blocking():
            waiting.set()
            go.wait(10)
        order.append("alice resumed")

    def bob() -> None:
        bob_running.set()
        bob_go.wait(10)
        order.append("bob")

    pool = FairExecutor(4, "test", slots=1, stall=30.0)
    try:
        a = pool.submit("alice", alice)
        assert waiting.wait(5)
        b = pool.submit("bob", bob)
        assert bob_running.wait(5)  # in alice's slot, while she waits
        go.set()  # alice's wait is over; she needs a slot, bob holds it
        time.sleep(0.1)
        c = pool.submit("carol", lambda: order.append("carol"))
        time.sleep(0.1)
        assert order == []  # alice waits for the slot; carol too
        bob_go.set()
        for f in (a, b, c):
            f.result(timeout=5)
    finally:
        go.set()
        bob_go.set()
        pool.shutdown()
    assert order == ["bob", "alice resumed", "carol"]


def test_a_stalled_slot_lets_one_more_call_start() -> None:
    """One slot held by a call that waits unmarked: another call starts after ``stall`` anyway."""
    release = threading.Event()
    counted: list[int] = []
    pool = FairExecutor(4, "test", slots=1, stall=0.1, on_stall=lambda: counted.append(1))
    try:
        holder = pool.submit("alice", lambda: release.wait(10))
        time.sleep(0.05)
        t0 = time.monotonic()
        pool.submit("bob", lambda: None).result(timeout=5)
        waited = time.monotonic() - t0
        assert not holder.done()
    finally:
        release.set()
        pool.shutdown()
    assert waited >= 0.05  # held back while the slot was fresh, not for ever
    assert (pool.stalls, len(counted)) == (1, 1)


def test_a_long_call_yields_its_slot_at_a_step_to_another_principal() -> None:
    """One slot: alice's long call parks at its next step when bob waits for the slot."""
    from server._steps import step

    stop = threading.Event()
    pool = FairExecutor(4, "test", slots=1, stall=30.0)

    def long_call() -> None:
        while not stop.is_set():
            time.sleep(0.005)
            step()

    try:
        alice = pool.submit("alice", long_call)
        time.sleep(0.05)
        pool.submit("bob", lambda: None).result(timeout=5)  # never starts unless alice yields
        assert pool.parked >= 1
        stop.set()
        alice.result(timeout=5)
    finally:
        stop.set()
        pool.shutdown()


def test_a_call_waiting_for_an_owner_lock_lends_its_slot() -> None:
    """Two slots: a build holds the owner's lock; a search of that owner waits lending its slot.

    Carol's call runs in that slot while the build goes on (no stall override:
    30 s).
    """
    from server.retrieval._build import OwnerLock

    lock = OwnerLock()
    building, build_go, bob_waiting = threading.Event(), threading.Event(), threading.Event()

    def build() -> None:
        with lock:
            building.set()
            build_go.wait(10)

    def search() -> None:
        bob_waiting.set()
        with lock:
            pass

    pool = FairExecutor(4, "test", slots=2, stall=30.0)
    try:
        a = pool.submit("alice", build)
        assert building.wait(5)
        b = pool.submit("bob", search)
        assert bob_waiting.wait(5)
        time.sleep(0.05)
        pool.submit("carol", lambda: None).result(timeout=5)  # bob lent his slot
        assert not b.done()
        build_go.set()
        a.result(timeout=5)
        b.result(timeout=5)
    finally:
        build_go.set()
        pool.shutdown()
