"""The runner's reports: accepted, events, finished, steered and heartbeats, applied as one transaction per
batch, idempotent under resends."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from types import SimpleNamespace
from typing import Any, Callable

from pydantic import BaseModel

from ...clock import Clock, utc
from ...domain.events import clean_usage, project
from ...domain.timeline import raw_payload
from ...domain.tasks import RUNTIME_LOST, Status, is_terminal
from ...runner import protocol as p
from ...store.db import Connection, Database, Row
from ...store.registry import SqlRegistryStore
from ...store.reports import SqlReportStore
from ...store.tasks import SqlTaskStore, event_rows
from ...store.timeline import SqlTimelineStore, timeline_rows
from ..auth.service import AuthService
from .dispatch import Dispatcher
from ..notify import Notifier, task_key
from .questions import record_question


log = logging.getLogger("amux.runtimes")


@dataclass
class _Effects:
    """What a batch changed, acted on after its transaction commits."""

    changed: set[str] = field(default_factory=set)
    started: list[tuple[str, float]] = field(default_factory=list)
    freed: bool = False
    # The runs this transaction read and locked, as this batch has changed them: a batch often carries several
    # reports of one run (accepted, events, finished), and the run is read once (None: not this runtime's).
    held: dict[tuple[str, int], SimpleNamespace | None] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)  # event rows not inserted yet (`event_rows`)
    timeline: list[dict[str, Any]] = field(default_factory=list)  # Agent Timeline rows not inserted yet
    stale: set[tuple[str, int]] = field(default_factory=set)  # reports of attempts that no longer hold their task
    # Runs the batch ended (their reservations released and run tokens revoked by `_write_pending`, one statement
    # each for the batch), and those of them whose task row it wrote terminal.
    ended: set[str] = field(default_factory=set)
    finished: set[str] = field(default_factory=set)


def _ack(msg: p.Accepted | p.Events | p.Finished, rseq: int, *, drop: bool) -> dict:
    """The reply to one report: it names the attempt, so a runner never applies it to a later attempt of the task."""
    return p.Ack(task_id=msg.task_id, attempt=msg.attempt, rseq=rseq, drop=drop).model_dump()


def _pending(row: Row) -> SimpleNamespace:
    """A held run as a batch changes it: `start_pending` / `seen_dirty` are the run's start and event counters the
    batch has yet to write (with its outcome if it also finishes in this batch, else by `_write_pending`)."""
    return SimpleNamespace(**row._asdict(), start_pending=None, seen_dirty=False)


NOT_YOURS = ("runner reported task {task}, which this runtime does not hold; the report was refused and nothing "
             "changed — the runner drops the task (it was reassigned, finished or never dispatched here)")


class RunnerReports:
    """Apply runner messages to the store; every method is idempotent under resends."""

    def __init__(self, db: Database, clock: Clock, notifier: Notifier, dispatcher: Dispatcher,
                 auth: AuthService | None = None,
                 on_started: Callable[[str, float], None] | None = None) -> None:
        self.db = db
        self.registry_store = SqlRegistryStore(db)
        self.store = SqlReportStore(db)
        self.tasks = SqlTaskStore(db)
        self.clock = clock
        self.notifier = notifier
        self.dispatcher = dispatcher
        self.auth = auth
        self.on_started = on_started or (lambda task_id, latency: None)

    async def apply(self, runtime_id: str, conn_id: str, messages: list[BaseModel]) -> list[dict]:
        """Apply a batch of runner messages in one transaction, in order; return the replies to send.

        One transaction per batch is what keeps the store from being the bottleneck: a runner flushes
        everything it produced in one loop turn (accepts, events, outcomes of several tasks) as one batch.
        """
        now = self.clock.now()
        fx, replies = await self.db.transaction(lambda conn: self._apply(conn, runtime_id, conn_id, messages, now))
        for task_id, latency in fx.started:
            self.on_started(task_id, latency)
        for task_id in fx.changed:
            self.notifier.notify(task_key(task_id))
        if fx.freed:
            self.dispatcher.kick()
        refused = [p.ErrorMsg(message=NOT_YOURS.format(task=r["task_id"])).model_dump()
                   for r in replies if r["type"] == "ack" and r["drop"]]
        return replies + refused

    async def _apply(self, conn: Connection, runtime_id: str, conn_id: str, messages: list[BaseModel],
                     now: datetime) -> tuple[_Effects, list[dict]]:
        """Apply the batch in the caller's transaction; return its effects and replies (fresh on each attempt)."""
        fx = _Effects()
        replies: list[dict] = []
        await self._hold_all(conn, runtime_id, messages, fx)
        for msg in messages:
            if isinstance(msg, p.Heartbeat):
                await self.registry_store.heartbeat(conn, runtime_id, conn_id, now)
            elif isinstance(msg, p.Accepted):
                verdict = await self._accepted(conn, runtime_id, msg, now, fx)
                replies.append(_ack(msg, 0, drop=verdict == "drop"))
                if verdict == "cancel":
                    replies.append(p.Cancel(task_id=msg.task_id, attempt=msg.attempt).model_dump())
            elif isinstance(msg, p.Events):
                last = await self._events(conn, runtime_id, msg, now, fx)
                replies.append(_ack(msg, last or 0, drop=last is None))
            elif isinstance(msg, p.Finished):
                ok = await self._finished(conn, runtime_id, msg, now, fx)
                replies.append(_ack(msg, msg.rseq, drop=not ok))
            elif isinstance(msg, p.Steered):
                # Taken by the running turn, or back to the mailbox for a later wake.
                await self.store.settle_steer(conn, msg.steer_id, msg.task_id, msg.delivered, now,
                                              note=msg.reason)
            if isinstance(msg, (p.Events, p.Finished)) and fx.held.get((msg.task_id, msg.attempt)) is None:
                fx.stale.add((msg.task_id, msg.attempt))
        await self._record_stale(conn, runtime_id, fx, now)
        await self._write_pending(conn, fx, now)
        return fx, replies

    async def _record_stale(self, conn: Connection, runtime_id: str, fx: _Effects, now: datetime) -> None:
        """Record, on the task, each report of an attempt that no longer holds it: dropped, never applied."""
        for task_id, attempt in sorted(fx.stale):
            placed = await self.store.placement_of(conn, task_id)
            if placed is None:
                continue
            log.warning("dropped a report of task %s attempt %d from runtime %s: that attempt no longer holds it "
                        "(the task is at attempt %s, %s)", task_id, attempt, runtime_id, placed.attempt, placed.status)
            note = {"text": f"a report from attempt {attempt} (runtime {runtime_id}) was dropped: that attempt no "
                            f"longer holds this task"}
            live = next((r for (t, _), r in fx.held.items() if t == task_id and r is not None), None)
            if live is None:
                await self.tasks.append_event(conn, task_id, "warning", note, now)
            else:  # the live attempt's events of this batch are numbered after it
                fx.events += event_rows(task_id, [("warning", note)], now, event_seq=live.event_seq)
                live.event_seq, live.seen_dirty = live.event_seq + 1, True

    async def heartbeat(self, runtime_id: str, conn_id: str) -> None:
        """Record that the runner is alive on this connection."""
        await self.apply(runtime_id, conn_id, [p.Heartbeat()])

    async def _held(self, conn: Connection, runtime_id: str, task_id: str, attempt: int,
                    fx: _Effects) -> SimpleNamespace | None:
        """The run this report is about, read (and locked) once per transaction; None when this runtime does not
        hold this attempt of it."""
        key = (task_id, attempt)
        if key not in fx.held:
            row = await self.store.held_run(conn, runtime_id, task_id, attempt)
            fx.held[key] = None if row is None else _pending(row)
        return fx.held[key]

    async def _hold_all(self, conn: Connection, runtime_id: str, messages: list[BaseModel], fx: _Effects) -> None:
        """Read (and lock) every run the batch reports on in one statement, as `_held` would one by one."""
        keys = {(m.task_id, m.attempt) for m in messages if isinstance(m, (p.Accepted, p.Events, p.Finished))}
        rows = await self.store.held_runs(conn, {task_id for task_id, _ in keys})
        for task_id, attempt in keys:
            row = rows.get(task_id)
            ours = row is not None and row.runtime_id == runtime_id and row.attempt == attempt
            fx.held[(task_id, attempt)] = _pending(row) if row is not None and ours else None

    async def _write_pending(self, conn: Connection, fx: _Effects, now: datetime) -> None:
        """Write what the batch's reports left pending: their events (one statement for the batch); for the runs it
        ended, the release of their reservations and the revocation of their run tokens (one statement each for the
        batch, after their task rows: the order every writer takes them in); and on runs that did not finish in it
        their start (the task row, then its reservation) and their event counters."""
        await self.tasks.insert_event_rows(conn, fx.events)
        await SqlTimelineStore.insert(conn, fx.timeline)
        fx.events, fx.timeline = [], []
        await self.tasks.release_reservations(conn, fx.finished, now)
        if self.auth is not None:
            await self.auth.revoke_runs(conn, fx.ended)  # the children's AMUX_TOKENs end with their runs
        fx.finished, fx.ended = set(), set()
        for (_, attempt), row in fx.held.items():
            if row is None:
                continue
            if row.start_pending is not None:
                await self.store.start_run(conn, row.id, attempt, row.start_pending)
            if row.seen_dirty:
                await self.tasks.mark_events_seen(conn, row.id, event_seq=row.event_seq, last_rseq=row.last_rseq,
                                                  usage=row.usage_json)

    async def _accepted(self, conn: Connection, runtime_id: str, msg: p.Accepted, now: datetime,
                        fx: _Effects) -> str:
        """Commit the reservation and mark the task running."""
        row = await self._held(conn, runtime_id, msg.task_id, msg.attempt, fx)
        if row is None:
            return "drop"
        if is_terminal(row.status):
            return "cancel"
        if row.status == Status.DISPATCHED.value:
            row.status, row.start_pending = Status.RUNNING.value, now  # written at the end of the batch
            fx.started.append((row.id, (now - utc(row.created_at)).total_seconds()))
            if row.session_id:  # the session's runtime is sticky from its first run
                await self.store.stick_session(conn, row.session_id, runtime_id)
        fx.changed.add(row.id)
        return "cancel" if row.cancel_requested_at is not None else "ok"

    async def _events(self, conn: Connection, runtime_id: str, msg: p.Events, now: datetime,
                      fx: _Effects) -> int | None:
        """Append new events in order (resends are skipped by the runner sequence)."""
        row = await self._held(conn, runtime_id, msg.task_id, msg.attempt, fx)
        if row is None:
            return None
        last = row.last_rseq
        usage = row.usage_json
        new: list[tuple[str, dict[str, Any]]] = []
        raw: list[tuple[int, str, Any]] = []
        for ev in msg.events:
            if ev.rseq <= last:
                continue
            last = ev.rseq
            if ev.type != "usage":  # the Agent Timeline: what the agent did, raw (secrets cut); usage is the run's
                raw.append((ev.rseq, ev.type, raw_payload(ev.payload)))
            payload = project(ev.type, ev.payload)
            if payload is None:
                continue
            if ev.type == "usage":
                if payload["usage"] == usage:
                    continue  # equal snapshots are deduplicated
                usage = payload["usage"]
            new.append((ev.type, payload))
        if new:
            fx.changed.add(row.id)
        fx.timeline += timeline_rows(row.id, raw, now)
        if last != row.last_rseq:  # new events, or resends skipped up to a later runner sequence
            fx.events += event_rows(row.id, new, now, event_seq=row.event_seq)  # inserted at the end of the batch
            row.event_seq, row.last_rseq, row.usage_json = row.event_seq + len(new), last, usage
            row.seen_dirty = True  # the counters are written once per batch
        return last

    async def _finished(self, conn: Connection, runtime_id: str, msg: p.Finished, now: datetime,
                        fx: _Effects) -> bool:
        """Record the terminal outcome and release capacity."""
        row = await self._held(conn, runtime_id, msg.task_id, msg.attempt, fx)
        if row is None:
            return False
        if row.status == Status.FAILED.value and row.error == RUNTIME_LOST and msg.outcome != "waiting_for_user":
            # The runtime was declared lost while this attempt ran, and its runner came back with the real outcome.
            if await self.tasks.correct_lost(conn, row.id, Status(msg.outcome), now, error=msg.error,
                                             result_text=msg.result_text, result_json=msg.result_json,
                                             usage=clean_usage(msg.usage) or row.usage_json,
                                             changed_files=msg.changed_files, lost_error=RUNTIME_LOST):
                note = {"text": f"the runner came back after its runtime was declared lost and reported "
                                f"{msg.outcome}; this record now says what happened"}
                fx.events += event_rows(row.id, [("status", note)], now, event_seq=row.event_seq)
                row.event_seq, row.seen_dirty = row.event_seq + 1, True
                fx.changed.add(row.id)
            row.status, row.last_rseq = msg.outcome, msg.rseq
            return True
        if not is_terminal(row.status):
            status, error = Status(msg.outcome), msg.error
            if status == Status.WAITING_FOR_USER and (row.kind != "turn" or msg.question is None):
                status, error = Status.FAILED, p.QUESTION_DIAGNOSTIC  # only a direct Session's Turn waits
            if await self.tasks.finish(conn, row.id, status, now, error=error,
                                       result_text=msg.result_text, result_json=msg.result_json,
                                       usage=clean_usage(msg.usage) or row.usage_json,
                                       changed_files=msg.changed_files, last_rseq=msg.rseq,
                                       resume_handle=msg.resume_handle, started_at=row.start_pending,
                                       event_seq=row.event_seq if row.seen_dirty else None, release=False):
                fx.finished.add(row.id)  # its reservation is released by `_write_pending`
            row.status, row.last_rseq, row.start_pending, row.seen_dirty = status.value, msg.rseq, None, False
            if status == Status.WAITING_FOR_USER and msg.question is not None:
                await record_question(conn, row, msg.question, now)
            if row.session_id and msg.resume_handle:
                await self.store.record_resume_handle(conn, row.session_id, msg.resume_handle, now)
            fx.freed = True
        fx.ended.add(row.id)  # its run token is revoked by `_write_pending`
        fx.changed.add(row.id)
        return True
