"""The adaptive in-flight window as plain logic: it shrinks to what the engine runs when
requests keep waiting inside it for memory, grows back one slot at a time while the gateway
holds requests back and the engine has room, stays within its bounds, and settles at the
engine's capacity instead of oscillating around it."""

from __future__ import annotations

from itertools import count, pairwise

from app.engine.base import EngineLoad
from app.scheduling.window import GROW_AFTER, HOLD_AFTER_SHRINK, SHRINK_AFTER, AdaptiveWindow

steps = count(1)


def report(running: int, waiting: int, kv: float) -> EngineLoad:
    return EngineLoad(running=running, waiting=waiting, kv_cache_usage=kv, step=next(steps))


def test_requests_waiting_inside_a_full_engine_shrink_the_window_to_what_it_runs() -> None:
    window = AdaptiveWindow(cap=64, floor=3)
    for _ in range(SHRINK_AFTER - 1):
        assert window.observe(report(40, 20, 0.97), held_back=True) == 64
    assert window.observe(report(40, 20, 0.97), held_back=True) == 40


def test_one_report_seen_twice_counts_once() -> None:
    window = AdaptiveWindow(cap=64, floor=3)
    same = report(40, 20, 0.97)
    for _ in range(SHRINK_AFTER + 3):
        window.observe(same, held_back=True)
    assert window.size == 64


def test_a_request_waiting_for_one_step_is_no_sign_of_a_limit() -> None:
    window = AdaptiveWindow(cap=64, floor=3)
    for _ in range(20):
        window.observe(report(60, 2, 0.97), held_back=True)
        window.observe(report(62, 0, 0.97), held_back=True)
    assert window.size == 64


def test_requests_waiting_while_memory_has_room_do_not_shrink_it() -> None:
    """They wait for the step's token budget (prefills), not for room: the engine's batch
    is not what limits it."""
    window = AdaptiveWindow(cap=64, floor=3)
    for _ in range(10):
        window.observe(report(30, 30, 0.4), held_back=True)
    assert window.size == 64


def test_a_window_draining_from_a_larger_one_does_not_shrink_further() -> None:
    window = AdaptiveWindow(cap=64, floor=3)
    for _ in range(SHRINK_AFTER):
        window.observe(report(10, 30, 1.0), held_back=True)
    assert window.size == 10
    # The engine runs the whole window; the rest of what the larger window let in waits.
    for _ in range(10):
        window.observe(report(10, 20, 1.0), held_back=True)
    assert window.size == 10


def test_it_never_shrinks_below_its_floor() -> None:
    window = AdaptiveWindow(cap=64, floor=3)
    for _ in range(SHRINK_AFTER):
        window.observe(report(1, 30, 1.0), held_back=True)
    assert window.size == 3


def shrunk_to(size: int) -> AdaptiveWindow:
    window = AdaptiveWindow(cap=16, floor=3)
    for _ in range(SHRINK_AFTER):
        window.observe(report(size, 5, 1.0), held_back=True)
    for _ in range(HOLD_AFTER_SHRINK):
        window.observe(report(size, 0, 0.1), held_back=True)
    assert window.size == size
    return window


def test_it_grows_one_slot_at_a_time_up_to_its_cap_while_held_back_with_room() -> None:
    window = shrunk_to(8)
    sizes = [window.observe(report(window.size, 0, 0.1), held_back=True) for _ in range(60)]
    assert sizes[: GROW_AFTER - 1] == [8] * (GROW_AFTER - 1)
    assert sizes[GROW_AFTER - 1] == 9
    assert max(b - a for a, b in pairwise(sizes)) == 1
    assert sizes[-1] == 16  # the cap, and no further


def test_it_waits_after_a_shrink_before_growing() -> None:
    window = AdaptiveWindow(cap=16, floor=3)
    for _ in range(SHRINK_AFTER):
        window.observe(report(8, 5, 1.0), held_back=True)
    for _ in range(HOLD_AFTER_SHRINK):
        assert window.observe(report(8, 0, 0.1), held_back=True) == 8


def test_it_does_not_grow_without_requests_held_back_for_it() -> None:
    window = shrunk_to(8)
    for _ in range(50):
        window.observe(report(4, 0, 0.1), held_back=False)
    assert window.size == 8


def test_it_does_not_grow_past_what_the_engines_memory_would_hold() -> None:
    """8 running use 0.8 of the KV cache: a ninth would take it past full."""
    window = shrunk_to(8)
    for _ in range(50):
        window.observe(report(8, 0, 0.8), held_back=True)
    assert window.size == 8


def simulate(*, capacity: int, tenants: int, reports: int) -> list[int]:
    """A closed loop against an engine with memory for ``capacity`` requests and a backlog
    that never ends: the window is the batch the tenants share; one tenant fills it, and
    beside it a newcomer holds the headroom's 2 beyond it."""
    window = AdaptiveWindow(cap=64, floor=3)
    sizes = []
    for _ in range(reports):
        in_flight = window.size if tenants == 1 else window.size + 2
        running = min(in_flight, capacity)
        load = report(running, in_flight - running, running / capacity)
        sizes.append(window.observe(load, held_back=True))
    return sizes


def test_it_settles_at_the_engines_capacity_without_oscillating() -> None:
    for tenants in (1, 2):
        sizes = simulate(capacity=20, tenants=tenants, reports=400)
        settled = sizes[100:]
        assert set(settled) == {20}, (tenants, sorted(set(sizes)))
    # Room for all it may hold: it stays at the cap.
    assert set(simulate(capacity=200, tenants=2, reports=200)) == {64}
