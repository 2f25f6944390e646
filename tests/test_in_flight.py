"""The worker's in-flight window: it grows while batches arrive fresh, halves at the staleness budget's edge,
never holds more leases than keep generation busy, and a window the operator fixed never moves."""

from __future__ import annotations

import pytest
from rollnet.node.in_flight import InFlightWindow


def test_fresh_batches_grow_the_window_by_one_per_window_of_submissions() -> None:
    window = InFlightWindow(budget=4, cap=16)
    assert window.size() == 4  # it starts at the budget
    for _ in range(4):
        window.note_submitted(2)  # two under the budget: room to feed the trainer faster
    assert window.size() == 4  # 4 + 4 x 1/4 = 5 minus rounding: grows by about one per window
    window.note_submitted(0)
    assert window.size() == 5
    for _ in range(200):
        window.note_submitted(0)
    assert window.size() == 16  # never above the cap


def test_a_batch_at_the_budgets_edge_halves_it_and_one_just_under_holds_it() -> None:
    window = InFlightWindow(budget=4, cap=16, start=10)
    window.note_submitted(3)  # one under: arrives near the edge, hold
    assert window.size() == 10
    window.note_submitted(4)
    assert window.size() == 5
    for _ in range(5):
        window.note_submitted(6)
    assert window.size() == 1  # never below one


def test_no_more_leases_than_keep_generation_busy() -> None:
    """Little's law: a lease holds its slot 2.5 s and a batch takes 0.25 s, so ten slots keep generation busy; a
    slow model (40 s batches, 45 s slots) needs two."""
    window = InFlightWindow(budget=4, cap=16, start=16)
    window.note_batch(0.25)
    window.note_decided(2.5)
    assert window.size() == 10
    slow = InFlightWindow(budget=2, cap=8, start=8)
    slow.note_batch(40.0)
    slow.note_decided(45.0)
    assert slow.size() == 2


@pytest.mark.parametrize("budget", [0, 1])
def test_a_budget_of_zero_or_one_keeps_one_lease_in_flight(budget: int) -> None:
    window = InFlightWindow(budget=budget, cap=4)
    assert window.size() == 1
    for g in (0, 0, 0):
        window.note_submitted(g)
    assert window.size() == 1


def test_a_fixed_window_never_moves() -> None:
    window = InFlightWindow(budget=4, cap=3, fixed=True, start=3)
    window.note_submitted(9)
    window.note_batch(1.0)
    window.note_decided(1.0)  # Little's law would say one
    assert window.size() == 3
    with pytest.raises(ValueError, match="cap must be at least 1"):
        InFlightWindow(budget=4, cap=0)
