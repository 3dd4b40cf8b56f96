"""Persistent Agent Instances: successive owner TaskRuns in one child session, a mailbox, steering."""
from __future__ import annotations

import asyncio
import time
from typing import Callable

from ...clock import Clock, iso
from ...domain.states import InstanceStatus, MailState
from ...domain.tasks import Status, is_terminal
from ...domain.pages import MAX_INSTANCES, page_limit
from ...errors import Conflict, Invalid, NotFound
from ...ids import new_id
from ...store.db import Connection, Database
from ...store.instances import SqlInstanceStore
from ...store.ports.sessions import InstanceStore, SessionStore
from ...store.records import InstanceRecord, SessionRecord
from ...store.sessions import SqlSessionStore
from ..auth.service import Caller
from ..notify import Notifier
from .service import SessionService
from ..tasks.service import TaskService
from ..views import (CancelledRun, FollowupView, InstanceCreatedView, InstanceListView, InstanceView, InstanceWaitView,
                    InterruptView, MailView, SteerView)

IDENTITY = ("profile", "engine", "model", "runtime", "reasoning_effort")


class InstanceService:
    """Create, follow up, message, steer, interrupt, wait on and archive Agent Instances."""

    def __init__(self, db: Database, clock: Clock, notifier: Notifier, sessions_: SessionService, tasks: TaskService,
                 steer_wait_s: float = 5.0, on_admitted: Callable[[], None] | None = None) -> None:
        self.db = db
        self.store: InstanceStore = SqlInstanceStore(db)
        self.session_store: SessionStore = SqlSessionStore(db)
        self.clock = clock
        self.notifier = notifier
        self.sessions = sessions_
        self.tasks = tasks
        self.steer_wait_s = steer_wait_s
        self.on_admitted = on_admitted or (lambda: None)

    async def create(self, caller: Caller, *, name: str | None = None, profile: str | None = None,
                     model: str | None = None, reasoning_effort: str | None = None, runtime: str | None = None,
                     permission_policy: str | None = None, extra_args: list[str] | None = None,
                     prompt: str | None = None, timeout_s: float | None = None) -> InstanceCreatedView:
        """Freeze the instance's identity and policy in a child session; optionally start its first run."""
        now = self.clock.now()
        async with self.db.write() as conn:
            ses = await self.sessions.create(caller, profile=profile, model=model, reasoning_effort=reasoning_effort,
                                             runtime=runtime, permission_policy=permission_policy,
                                             extra_args=extra_args, source="instance", kind="child", conn=conn)
            child = await self._session(conn, ses["session_id"])
            iid = new_id("ai")
            await self.store.create(conn, instance_id=iid, owner_id=caller.principal_id, name=name,
                                    session_id=ses["session_id"], snapshot=child.snapshot, now=now)
        view = await self.get(caller, iid)
        task_id = (await self.followup(caller, iid, prompt, timeout_s=timeout_s)).task_id if prompt else None
        return InstanceCreatedView(**dict(view), task_id=task_id)

    async def _session(self, conn: Connection, session_id: str) -> SessionRecord:
        row = await self.session_store.get(conn, session_id)
        if row is None:  # an instance's Session is never deleted
            raise NotFound(f"session {session_id!r} of this instance does not exist")
        return row

    async def _instance(self, conn: Connection, caller: Caller, iid: str) -> InstanceRecord:
        row = await self.store.get(conn, iid)
        if row is None or (row.owner_id != caller.principal_id and not caller.admin):
            raise NotFound(f"instance {iid!r} does not exist or is not yours; instance_create makes one")
        return row

    async def followup(self, caller: Caller, iid: str, prompt: str, *, timeout_s: float | None = None,
                       **identity: str | None) -> FollowupView:
        """Submit work as a new owner TaskRun on the saved identity; queued mailbox input goes first."""
        async with self.db.write() as conn:
            inst = await self._instance(conn, caller, iid)
            if inst.archived_at is not None:
                raise Conflict(f"instance {iid} is archived; create a new instance with instance_create")
            if inst.owner_id != caller.principal_id:
                raise Conflict(f"instance {iid} runs as its owner; a persistent instance cannot change its effective "
                               "principal — its owner follows it up, or create your own instance")
            snap = dict(inst.snapshot)
            if not snap.get("permission_policy"):
                raise Conflict(f"instance {iid} has a legacy snapshot without a frozen permission policy and is never "
                               "reused; create a new instance with instance_create")
            self._no_switch(iid, snap, identity)
            if timeout_s is not None:
                if not 0 < float(timeout_s) <= 7 * 86400:
                    raise Invalid("timeout_s must be a number of seconds between 0 and 604800")
                snap["timeout_s"] = float(timeout_s)
            s = await self._session(conn, inst.session_id)
            queued = await self.store.queued_mail(conn, iid)
            full = "\n".join([m.text for m in queued] + [prompt])
            self.sessions.admission.check_prompt(snap["engine"], full)
            task_id = await self.sessions.add_run(conn, s, full, kind="task", source="instance", instance_id=iid,
                                                  snapshot=snap)
            await self.store.deliver(conn, [m.id for m in queued], task_id, self.clock.now())
            await self.store.set_current_run(conn, iid, task_id, self.clock.now())
        self.on_admitted()
        return FollowupView(instance_id=iid, task_id=task_id, status=Status.QUEUED.value, mailbox_delivered=len(queued))

    @staticmethod
    def _no_switch(iid: str, snap: dict, identity: dict[str, str | None]) -> None:
        """Omitted identity restores the saved one; an explicit change is refused (no-switch contract)."""
        if identity.get("permission_policy") not in (None, snap.get("permission_policy")):
            raise Conflict(f"instance {iid} keeps permission_policy {snap.get('permission_policy')}; "
                           "a policy change needs a new instance (instance_create)")
        saved = {"profile": snap["profile"]["ref"], "engine": snap["engine"], "model": snap.get("model"),
                 "runtime": snap.get("runtime"), "reasoning_effort": snap.get("reasoning_effort")}
        for key in IDENTITY:
            asked = identity.get(key)
            if asked is not None and asked != saved[key]:
                raise Conflict(f"instance {iid} is bound to {key} {saved[key]!r}; it cannot switch to {asked!r} — "
                               "omit it to keep the saved identity, or create a new instance")

    async def send(self, caller: Caller, iid: str, text: str) -> MailView:
        """Queue mailbox input; it is delivered ahead of the next prompt on a later wake."""
        if not isinstance(text, str) or not text.strip():
            raise Invalid("the message is empty")
        async with self.db.write() as conn:
            inst = await self._instance(conn, caller, iid)
            if inst.archived_at is not None:
                raise Conflict(f"instance {iid} is archived; create a new instance with instance_create")
            mid = new_id("mb")
            await self.store.add_mail(conn, message_id=mid, instance_id=iid, text=text, kind="queued",
                                      state=MailState.QUEUED, now=self.clock.now())
        return MailView(instance_id=iid, message_id=mid, state=MailState.QUEUED.value)

    async def steer(self, caller: Caller, iid: str, text: str) -> SteerView:
        """Correct the running Turn, else queue it in the mailbox (idle too); `delivery`: delivered|queued|unknown."""
        if not isinstance(text, str) or not text.strip():
            raise Invalid("the correction is empty; pass the text the running turn should take")
        async with self.db.write() as conn:
            inst = await self._instance(conn, caller, iid)
            if inst.archived_at is not None:
                raise Conflict(f"instance {iid} is archived and takes no corrections; create a new instance with "
                               "instance_create (instance_get shows what the archived one did)")
            unfinished = await self.store.unfinished_runs(conn, iid)
            current = next((r for r in unfinished if r.status == Status.RUNNING.value), None)
            mid = new_id("mb")
            await self.store.add_mail(conn, message_id=mid, instance_id=iid, text=text, kind="steer",
                                      state=MailState.PENDING if current else MailState.QUEUED,
                                      task_id=current.id if current else None, now=self.clock.now())
        if current is None:
            idle = not unfinished
            why = ("the instance is idle, so no turn could take the correction" if idle else
                   "its turn has not started yet, so it could not take the correction")
            return SteerView(instance_id=iid, delivery=MailState.QUEUED.value, message_id=mid,
                             note=f"{why}; it is queued in the mailbox and goes ahead of the next prompt "
                                  "(instance_followup)")
        self.notifier.notify(f"runtime:{current.runtime_id}")
        return await self._settle(iid, mid)

    async def _settle(self, iid: str, mid: str) -> SteerView:
        deadline = time.monotonic() + self.steer_wait_s
        while time.monotonic() < deadline:
            async with self.db.read() as conn:
                state = await self.store.mail_state(conn, mid)
                reason = await self.store.mail_note(conn, mid) if state == MailState.QUEUED else None
            if state == MailState.DELIVERED:
                return SteerView(instance_id=iid, delivery=MailState.DELIVERED.value, message_id=mid,
                                 note="the running turn took the correction")
            if state == MailState.QUEUED:
                why = reason or "no turn could take the correction"
                return SteerView(instance_id=iid, delivery=MailState.QUEUED.value, message_id=mid,
                                 note=f"{why}; it is queued in the mailbox for the next wake (instance_followup)",
                                 reason=why)
            await asyncio.sleep(0.05)
        async with self.db.write() as conn:
            gave_up = await self.store.give_up_steer(conn, mid, self.clock.now())
        if not gave_up:
            return await self._settle(iid, mid)
        return SteerView(instance_id=iid, delivery=MailState.UNKNOWN.value, message_id=mid,
                         note="the runner did not confirm delivery; the correction was not queued — check the turn "
                              "(instance_get), then steer again if needed")

    async def interrupt(self, caller: Caller, iid: str) -> InterruptView:
        """Cancel every unfinished owner TaskRun (the running one and those queued behind it); the instance stays.

        The newest is cancelled first, so a queued run cannot start in the place of the one just cancelled.
        """
        async with self.db.read() as conn:
            inst = await self._instance(conn, caller, iid)
            unfinished = await self.store.unfinished_runs(conn, iid)
        if not unfinished:
            if not inst.current_task_id:
                raise Conflict(f"instance {iid} has no run to interrupt")
            ans = await self.tasks.cancel(caller, inst.current_task_id)
            return InterruptView(instance_id=iid, task_id=inst.current_task_id, task_status=ans["status"],
                                 cancelled=[])
        answers = {r.id: await self.tasks.cancel(caller, r.id) for r in reversed(unfinished)}
        first = unfinished[0].id
        return InterruptView(instance_id=iid, task_id=first, task_status=answers[first]["status"],
                             cancelled=[CancelledRun(task_id=r.id, status=answers[r.id]["status"])
                                        for r in unfinished])

    async def wait(self, caller: Caller, iid: str, timeout_s: float = 30.0) -> InstanceWaitView:
        """Wait for the current run; a timeout never cancels or times out the Task."""
        async with self.db.read() as conn:
            inst = await self._instance(conn, caller, iid)
        if not inst.current_task_id:
            return InstanceWaitView(**dict(await self.get(caller, iid)))
        view = await self.tasks.wait_terminal(caller, inst.current_task_id,
                                              timeout_s=max(0.0, min(float(timeout_s), 600.0)))
        return InstanceWaitView(**dict(await self.get(caller, iid)), task=view, timed_out=not is_terminal(view.status))

    async def archive(self, caller: Caller, iid: str) -> InstanceView:
        """Archive an idle instance (no unfinished owner run); it takes no more work."""
        async with self.db.write() as conn:
            await self._instance(conn, caller, iid)
            unfinished = await self.store.unfinished_runs(conn, iid)
            if unfinished:
                raise Conflict(f"instance {iid} is active ({len(unfinished)} unfinished run(s): "
                               f"{', '.join(r.id for r in unfinished)}); interrupt it (instance_interrupt) or wait "
                               "for it (instance_wait) before archiving")
            await self.store.archive(conn, iid, self.clock.now())
        return await self.get(caller, iid)

    async def list(self, caller: Caller, *, archived: bool = False, limit: int = 50) -> InstanceListView:
        """Return the caller's instances, newest first, each as `get` shows it (archived ones only when asked)."""
        limit = page_limit(limit, MAX_INSTANCES, "instances")
        async with self.db.read() as conn:
            ids = await self.store.ids_of_owner(conn, caller.principal_id, archived=archived, limit=limit)
        return InstanceListView(instances=[await self.get(caller, iid) for iid in ids])

    async def get(self, caller: Caller, iid: str) -> InstanceView:
        """Return the instance: status (active while any owner run is unfinished), sticky runtime, refs, policy."""
        async with self.db.read() as conn:
            inst = await self._instance(conn, caller, iid)
            s = await self._session(conn, inst.session_id)
            run = await self.store.current_run(conn, inst.current_task_id)
            current = run.status if run is not None else None
            unfinished = await self.store.unfinished_runs(conn, iid)
            runtime = await self.session_store.runtime_name(conn, s.runtime_id)
            queued = await self.store.count_queued(conn, iid)
        status = (InstanceStatus.ARCHIVED if inst.archived_at else
                  InstanceStatus.ACTIVE if unfinished else InstanceStatus.IDLE)
        snap = inst.snapshot
        return InstanceView(instance_id=iid, name=inst.name, status=status.value, session_id=inst.session_id,
                            profile=snap["profile"]["ref"], engine=snap["engine"], model=snap.get("model"),
                            permission_policy=snap.get("permission_policy"), runtime=runtime,
                            workspace_ref=f"{runtime or '?'}:{inst.session_id}",
                            home_ref=f"{runtime or '?'}:{inst.session_id}/.home", resume_handle=s.resume_handle,
                            current_task_id=inst.current_task_id, current_task_status=current,
                            unfinished_task_ids=[r.id for r in unfinished], mailbox_queued=queued,
                            created_at=iso(inst.created_at))

