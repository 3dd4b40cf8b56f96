"""The fair share (README "Fair sharing"): how many slots a principal may hold while others wait (pure).

A principal's share of a pool — the online runtimes that could run its task — is ceil(slots / principals with work
there), counting principals that hold runs on the pool or have queued tasks that could run on it. Below its share a
principal takes any free slot its task fits; at or above it, only slots no principal below its own share is waiting
for. Nobody else waiting, a principal uses every free slot (work-conserving); running tasks are never pre-empted, so
the share is reached as runs end.
"""
from __future__ import annotations

from typing import Mapping


def fair_share(slots: int, principals: int) -> int:
    """Return a principal's share of `slots` among `principals` with work: ceil(slots / principals), at least 1."""
    return max(1, -(-slots // max(1, principals)))


class FairShares:
    """One placement round's shares: told of each placement, and of each queued task that will not start this
    round (its session is busy, its owner at an operator cap), so it no longer counts as waiting."""

    def __init__(self, slots: Mapping[str, int], held: Mapping[tuple[str, str], int],
                 queued: Mapping[str, tuple[str, frozenset[str]]]) -> None:
        """Take each online runtime's slots, the runs each (owner, runtime) holds, and each queued task's owner and
        the online runtimes it could run on."""
        self.slots = dict(slots)
        self.held = dict(held)
        self.queued = dict(queued)
        self.waiting = dict(queued)  # what could still take a slot this round
        self._shares: dict[frozenset[str], int] = {}
        self._holds: dict[tuple[str, frozenset[str]], int] = {}

    def share(self, pool: frozenset[str]) -> int:
        """Return the fair share of `pool`: its slots over the principals holding runs on it or queued for it."""
        if pool not in self._shares:
            owners = {o for (o, rt), n in self.held.items() if n > 0 and rt in pool}
            owners |= {o for o, fits in self.queued.values() if fits & pool}
            self._shares[pool] = fair_share(sum(self.slots.get(rt, 0) for rt in pool), len(owners))
        return self._shares[pool]

    def holds(self, owner: str, pool: frozenset[str]) -> int:
        """Count the runs `owner` holds on `pool`."""
        key = (owner, pool)
        if key not in self._holds:
            self._holds[key] = sum(n for (o, rt), n in self.held.items() if o == owner and rt in pool)
        return self._holds[key]

    def below_share(self, task_id: str) -> bool:
        """Say whether the task's owner holds fewer runs than its share of the runtimes the task could run on."""
        owner, pool = self.queued[task_id]
        return self.holds(owner, pool) < self.share(pool)

    def may_take(self, task_id: str, runtime_id: str) -> bool:
        """Say whether the task may take a free slot of `runtime_id`: always below its owner's share; at or above it,
        only when no other principal below its share has a task waiting that could run there."""
        if self.below_share(task_id):
            return True
        owner = self.queued[task_id][0]
        return not any(o != owner and runtime_id in fits and self.below_share(t)
                       for t, (o, fits) in self.waiting.items())

    def placed(self, task_id: str, runtime_id: str) -> None:
        """Count the task's run on `runtime_id`; it waits no more."""
        owner = self.queued[task_id][0]
        self.held[(owner, runtime_id)] = self.held.get((owner, runtime_id), 0) + 1
        for (o, pool) in self._holds:
            if o == owner and runtime_id in pool:
                self._holds[(o, pool)] += 1
        self.waiting.pop(task_id, None)

    def not_starting(self, task_id: str) -> None:
        """Stop counting the task as waiting (it cannot start this round)."""
        self.waiting.pop(task_id, None)
