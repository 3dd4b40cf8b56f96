"""The fair share (hub/domain/fair_share.py): ceil(slots / principals with work), work-conserving, per pool."""
from __future__ import annotations

import pytest

from hub.domain.fair_share import FairShares, fair_share

ONE = frozenset({"rt1"})
BOTH = frozenset({"rt1", "rt2"})


@pytest.mark.parametrize("slots, principals, share", [
    (8, 1, 8),   # alone: every slot
    (8, 2, 4),
    (8, 3, 3),   # rounded up: the shares cover every slot, so a free slot always has someone to go to
    (2, 3, 1),   # fewer slots than principals: one each, taken in queue order
    (0, 2, 1),   # no slots: the share is never below one run
    (5, 0, 5),
])
def test_a_share_is_the_slots_over_the_principals_with_work_rounded_up(slots, principals, share):
    assert fair_share(slots, principals) == share


@pytest.mark.parametrize("held, queued, task, runtime, may", [
    # alone: alice may take every free slot, whatever she holds
    ({("alice", "rt1"): 7}, {"a": ("alice", ONE)}, "a", "rt1", True),
    # bob waits for rt1 and holds nothing: alice, at her share of 8 / 2, gives way
    ({("alice", "rt1"): 4}, {"a": ("alice", ONE), "b": ("bob", ONE)}, "a", "rt1", False),
    # ... but below her share she takes it (queue order decides between the two)
    ({("alice", "rt1"): 3}, {"a": ("alice", ONE), "b": ("bob", ONE)}, "a", "rt1", True),
    # bob at his own share is no reason to give way: the slot goes by queue order
    ({("alice", "rt1"): 4, ("bob", "rt1"): 4}, {"a": ("alice", ONE), "b": ("bob", ONE)}, "a", "rt1", True),
    # bob's task cannot run on rt2: alice may use rt2 while he waits for rt1 (work-conserving)
    ({("alice", "rt1"): 4, ("alice", "rt2"): 4}, {"a": ("alice", BOTH), "b": ("bob", ONE)}, "a", "rt2", True),
    ({("alice", "rt1"): 4, ("alice", "rt2"): 4}, {"a": ("alice", BOTH), "b": ("bob", ONE)}, "a", "rt1", False),
    # a principal holding runs but queueing nothing counts in the share, but is not waiting
    ({("alice", "rt1"): 3, ("carol", "rt1"): 2}, {"a": ("alice", ONE), "b": ("bob", ONE)}, "a", "rt1", False),
    ({("alice", "rt1"): 3, ("carol", "rt1"): 5}, {"a": ("alice", ONE)}, "a", "rt1", True),
    # bob's runs on his own runtime (rt2) do not count against his share of rt1, which his task needs
    ({("alice", "rt1"): 4, ("bob", "rt2"): 8}, {"a": ("alice", ONE), "b": ("bob", ONE)}, "a", "rt1", False),
])
def test_at_its_share_a_principal_gives_way_only_to_one_below_its_own_share_waiting_for_the_same_runtime(
        held, queued, task, runtime, may):
    assert FairShares({"rt1": 8, "rt2": 8}, held, queued).may_take(task, runtime) is may


def test_a_placed_or_held_back_task_no_longer_counts_as_waiting():
    shares = FairShares({"rt1": 4}, {("alice", "rt1"): 2}, {"a": ("alice", ONE), "b": ("bob", ONE),
                                                              "b2": ("bob", ONE)})
    assert not shares.may_take("a", "rt1")
    shares.placed("b", "rt1")  # bob holds one of his share of two; b2 still waits
    assert shares.holds("bob", ONE) == 1 and not shares.may_take("a", "rt1")
    shares.not_starting("b2")  # e.g. its session is busy
    assert shares.may_take("a", "rt1")
