"""The statements each task phase runs, counted on both stores, so that they cannot creep back: created →
dispatched (placement and the hand-off), dispatched → started (the runner's Accepted and its first events),
started → finished (the Finished report)."""
from __future__ import annotations

import contextlib
from typing import Iterator

from sqlalchemy import event

from hub.runner import protocol as p
from tests.contract.test_task_store import core, register, submit  # noqa: F401
from tests.helpers import runner_accepted, runner_events, runner_finished, runner_outgoing


@contextlib.contextmanager
def counted(hub) -> Iterator[list[str]]:
    """Collect every statement the hub's engine runs inside the block (BEGIN/COMMIT and pragmas left out)."""
    seen: list[str] = []

    def record(_c, _cur, statement, *_rest) -> None:
        head = statement.lstrip().split(None, 1)[0].upper() if statement.strip() else ""
        if head in ("SELECT", "INSERT", "UPDATE", "DELETE", "WITH"):
            seen.append(statement)

    event.listen(hub.db.sync_engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(hub.db.sync_engine, "before_cursor_execute", record)


async def test_each_task_phase_runs_a_bounded_number_of_statements(core, db):
    rt, conn_id = await register(core, slots=1)
    tid = await submit(core)
    with counted(core) as dispatched:
        await core.dispatcher.place_once()
        [msg] = await runner_outgoing(core.runner_dispatch, rt, conn_id, set())
    assert msg["type"] == "dispatch"
    with counted(core) as started:
        await runner_accepted(core.reports, rt, p.Accepted(task_id=tid, attempt=1))
        await runner_events(core.reports, rt, p.Events(task_id=tid, attempt=1, events=[
            p.Event(rseq=1, type="text", payload={"text": "hi"})]))
    with counted(core) as finished:
        await runner_finished(core.reports, rt, p.Finished(task_id=tid, attempt=1, rseq=2, outcome="succeeded",
                                                           result_text="hi"))
    counts = (len(dispatched), len(started), len(finished))
    # created → dispatched: placement (the queue window, the runtimes, the running counts, the reservation and the
    # run's row; PostgreSQL also takes its advisory lock) and the hand-off (the connection's due work, the run
    # token, the `dispatched` event); dispatched → started: the Accepted (read, start, commit the reservation) and
    # the first events (read, events, timeline, counters); started → finished: read, finish, release, revoke.
    expected = {"sqlite": (19, 7, 4), "postgresql": (20, 7, 4)}[db.dialect.name]
    assert counts == expected, "\n".join(f"{name}: {' '.join(s.split())[:150]}" for name, phase in
                                          (("dispatched", dispatched), ("started", started), ("finished", finished))
                                          for s in phase)
