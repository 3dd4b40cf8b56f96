"""Schedule definitions: create, read, update, pause, resume, delete, history, and the personal views of them
(the firing loop is in schedule_firing)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from datetime import datetime
from typing import Any, Callable

from ...clock import Clock, iso, utc
from ...config import FeishuSettings, SchedulesSettings
from ...domain import schedule_rules as rules
from ...domain.choices import CHOICES
from ...domain.states import BindingStatus
from ...errors import Invalid
from ...ids import new_id
from ...store.db import Connection, Database
from ...store.firings import SqlFiringStore
from ...store.incidents import SqlIncidentStore
from ...store.ports.schedules import ScheduleStore
from ...store.schedules import SqlScheduleStore
from ..tasks.admission import Admission, SubmitRequest
from ..auth.service import Caller
from ..tasks.delegation import delegation_parent
from .notices import route
from .access import ScheduleAccess
from .ports import SessionPort
from ..views import ScheduleNotifications, ScheduleView
from .views import ResultPage, ScheduleCard, ScheduleLine, SchedulePage, Summary, failing, firing_line

TYPES = ("subtask", "session-prompt")
NOTIFY = ("failures", "all", "none")
OVERLAP = ("allow", "skip", "replace")
OVERLAP_SESSION = ("overlap applies to subtask schedules: a session-prompt's Turns already queue in their Session one "
                   "after another; omit overlap (or pass \"allow\"), or use schedule_type \"subtask\"")
NO_SESSIONS = ("session-prompt schedules need Sessions, which this hub does not offer yet; "
               "use schedule_type \"subtask\" (the default) to submit a child Task instead")


@dataclass(kw_only=True)
class ScheduleSpec:
    """What a caller asks for; every field may be omitted on update (None = keep). The execution choices are
    `hub.domain.choices.ExecutionChoices`' fields, checked by admission against its bounds at create, update and
    each fire."""

    name: str | None = None
    prompt: str | None = None
    rule: str | None = None
    timezone: str | None = None
    schedule_type: str | None = None
    session_ref: str | None = None
    profile: str | None = None
    runtime: str | None = None
    model: str | None = None
    reasoning_effort: str | None = None
    extra_args: list[str] | None = None
    permission_policy: str | None = None
    credential_profile: str | None = None
    timeout_s: float | None = None
    notify: str | None = None   # failures (default) | all | none: which outcomes reach the administrator
    overlap: str | None = None  # allow (default) | skip | replace: a fire while the previous Task is unfinished

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ScheduleSpec":
        """Build from a JSON object, refusing unknown fields."""
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise Invalid(f"unknown fields {sorted(unknown)}; a schedule takes {sorted(known)}")
        return cls(**data)


def provenance_of(caller: Caller, source: str) -> dict[str, Any]:
    """Freeze how the creator was authenticated (a Feishu Turn receipt will add its own fields)."""
    return {"source": source, "token_id": caller.token_id, "label": caller.label, "principal": caller.principal}


def submit_request(row: Any) -> SubmitRequest:
    """Return the Task request a subtask schedule makes: the caller's choices as given, defaults left open."""
    return SubmitRequest(prompt=row.prompt, profile=row.profile, runtime=row.runtime, model=row.model,
                         extra_args=row.extra_args, timeout_s=row.timeout_s, name=row.name,
                         reasoning_effort=row.reasoning_effort, permission_policy=row.permission_policy,
                         credential_profile=row.credential_profile)



class ScheduleService:
    """Keep schedule definitions; each trigger resolves content and omitted defaults again (schedule_firing)."""

    def __init__(self, db: Database, clock: Clock, settings: SchedulesSettings, admission: Admission,
                 sessions: SessionPort | None = None, on_changed: Callable[[], None] | None = None,
                 feishu: FeishuSettings | None = None) -> None:
        self.db = db
        self.feishu = feishu  # the configured applications decide where notices go
        self.clock = clock
        self.settings = settings
        self.admission = admission
        self.sessions = sessions
        self.on_changed = on_changed or (lambda: None)
        self.store: ScheduleStore = SqlScheduleStore(db)
        self.firings = SqlFiringStore(db)
        self.access = ScheduleAccess(db)
        self.firing: Any = None  # ScheduleFiring, wired by the app (run_now fires through the same loop code)

    # ------------------------------------------------------------ attribution

    async def turn_attribution(self, conn: Connection, caller: Caller,
                               provenance: dict[str, Any]) -> tuple[str | None, str | None]:
        """Attribute a schedule made during a Feishu Turn to that exact Turn's receipt (binding and application).

        Only an agent acting with its session's `amux-session:<id>` token, during an active Turn whose frozen
        receipt names an active binding of the same principal, is attributed — never the latest speaker of
        the chat, a recipient or the bot owner. Anything else stays unattributed (no proactive notices).
        """
        _parent, turn_id, _ctx = await delegation_parent(conn, caller)
        if turn_id is None:
            return None, None
        receipt = await self.store.turn_receipt(conn, turn_id)
        provenance["turn_id"] = turn_id
        provenance["receipt"] = receipt
        if receipt.get("source") != "feishu" or not receipt.get("binding_id"):
            return None, None
        binding = await self.store.binding(conn, receipt["binding_id"])
        if binding is None or binding.status != BindingStatus.ACTIVE or binding.principal_id != caller.principal_id \
                or binding.app_id != receipt.get("app_id"):
            return None, None
        return binding.id, binding.app_id

    async def binding_attribution(self, conn: Connection, caller: Caller,
                                  provenance: dict[str, Any]) -> tuple[str | None, str | None]:
        """Freeze the creator's single active Feishu binding for a schedule made over MCP/CLI (outside any Turn).

        None when the principal has no active binding or several (then `notice_route` decides at notice time).
        """
        rows = await self.store.active_bindings(conn, caller.principal_id)
        if len(rows) != 1:
            provenance["attribution"] = {"basis": "no_binding" if not rows else "several_bindings"}
            return None, None
        provenance["attribution"] = {"basis": "single_active_binding", "binding_id": rows[0].id,
                                     "app_id": rows[0].app_id}
        return rows[0].id, rows[0].app_id

    async def card_attribution(self, conn: Connection, caller: Caller, receipt: dict[str, Any],
                               provenance: dict[str, Any]) -> tuple[str, str]:
        """Freeze the Feishu identity that submitted a schedule form: the card action's receipt names the active
        binding the bot authenticated (its application and open_id); refused unless that binding is still active
        and the caller's own."""
        binding = await self.store.binding(conn, str(receipt.get("binding_id") or ""))
        if binding is None or binding.status != BindingStatus.ACTIVE or binding.principal_id != caller.principal_id \
                or binding.app_id != receipt.get("app_id"):
            raise Invalid("this Feishu identity has no active amux binding; send `/amux link CODE` first")
        provenance["receipt"] = {"source": "feishu", "kind": "card_action", **receipt}
        provenance["attribution"] = {"basis": "card_action_receipt", "binding_id": binding.id,
                                     "app_id": binding.app_id}
        return binding.id, binding.app_id

    async def usable_profiles(self, caller: Caller) -> list[str]:
        """Return the profile names a schedule of this caller would be admitted with (the same admission check as
        `schedule_create`, profile by profile)."""
        names = [p["name"] for p in await self.admission.profiles.list()]
        # One batch (admission resolves what the profiles share once); the probe prompt is one every engine's prompt
        # check accepts (the scripted engine parses its prompt as a script).
        async with self.db.read() as conn:
            snaps = await self.admission.freeze_many(
                conn, [(caller, SubmitRequest(prompt="say probe", profile=n)) for n in names], origin="schedule")
        return [n for n, snap in zip(names, snaps) if not isinstance(snap, Exception)]

    # ------------------------------------------------------------ validation

    async def _validate(self, caller: Caller, s: ScheduleSpec, now: datetime, anchor: datetime) -> datetime | None:
        if s.schedule_type not in TYPES:
            raise Invalid(f"schedule_type {s.schedule_type!r} is unknown; "
                          "use \"subtask\" (default) or \"session-prompt\"")
        if not isinstance(s.name, str) or not s.name.strip() or len(s.name) > 200:
            raise Invalid("name must be a non-empty string of at most 200 characters")
        if not isinstance(s.prompt, str) or not s.prompt.strip():
            raise Invalid("prompt is empty; pass what each firing should ask as `prompt`")
        if s.notify is not None and s.notify not in NOTIFY:
            raise Invalid(f"notify {s.notify!r} is unknown; use \"failures\" (default), \"all\" or \"none\"")
        if s.overlap is not None and s.overlap not in OVERLAP:
            raise Invalid(f"overlap {s.overlap!r} is unknown; use \"allow\" (default: every fire admits its Task), "
                          "\"skip\" (no new Task while the previous one is unfinished) or \"replace\" (cancel it, "
                          "then admit the new one)")
        rule = rules.parse(s.rule, s.timezone)
        rules.check_min_interval(rule, self.settings.min_interval_s)
        first = rules.first_fire(rule, now, anchor)
        if first is None:
            raise Invalid(f"rule {s.rule!r} has no future fire time; pick a time after {now.isoformat()}")
        if s.schedule_type == "session-prompt":
            if self.sessions is None:
                raise Invalid(NO_SESSIONS)
            if s.overlap not in (None, "allow"):
                raise Invalid(OVERLAP_SESSION)
            given = [k for k in CHOICES if getattr(s, k) not in (None, [])]
            if given:
                raise Invalid(f"a session-prompt uses its Session's execution settings; omit {', '.join(given)} "
                              "(or use schedule_type \"subtask\")")
            if not s.session_ref:
                raise Invalid("session-prompt needs session_ref (or AMUX_SESSION_ID for the CLI); "
                              "session_list (`amux session list`) shows your sessions")
            s.session_ref = await self.sessions.resolve_ref(caller, s.session_ref)
            if len(s.prompt.encode()) > self.admission.hub.max_prompt_bytes:
                raise Invalid(f"prompt is larger than {self.admission.hub.max_prompt_bytes} bytes; "
                              "put large inputs in files")
        else:
            if s.session_ref:
                raise Invalid("session_ref applies to session-prompt schedules only; "
                              "omit it or pass schedule_type \"session-prompt\"")
            async with self.db.read() as conn:  # same rules and defaults as Task submission, at each trigger too
                await self.admission.freeze(conn, caller, submit_request(s), origin="schedule")
        return first

    # ------------------------------------------------------------ commands

    async def create(self, caller: Caller, spec: ScheduleSpec, *, source: str = "mcp",
                     card_receipt: dict[str, Any] | None = None) -> ScheduleView:
        """Create a schedule; the creator and provenance are frozen from the authenticated caller (`card_receipt`:
        a Feishu schedule form's card action, whose binding becomes the frozen creator binding)."""
        spec = ScheduleSpec(**asdict(spec))
        spec.schedule_type = spec.schedule_type or "subtask"
        zone_given = bool(spec.timezone)
        spec.timezone = spec.timezone or self.settings.default_timezone
        if spec.name is None and isinstance(spec.prompt, str):
            spec.name = " ".join(spec.prompt.split())[:60] or None
        now = self.clock.now()
        first = await self._validate(caller, spec, now, now)
        sid = new_id("sch")
        values = {k: getattr(spec, k) for k in ("name", "prompt", "rule", "timezone", "session_ref") + CHOICES}
        values["rule"] = rules.parse(spec.rule, spec.timezone).text
        values["notify"] = spec.notify or "failures"
        values["overlap"] = spec.overlap or "allow"
        async with self.db.write() as conn:
            provenance = provenance_of(caller, source)
            binding_id: str | None
            app_id: str | None
            if card_receipt is not None:
                binding_id, app_id = await self.card_attribution(conn, caller, card_receipt, provenance)
            else:
                binding_id, app_id = await self.turn_attribution(conn, caller, provenance)
            if binding_id is None and "turn_id" not in provenance:
                binding_id, app_id = await self.binding_attribution(conn, caller, provenance)
            elif app_id is not None and not zone_given:
                first = await self._chat_timezone(conn, spec, values, provenance, app_id, now) or first
            await self.store.insert(conn, {
                "id": sid, "creator_id": caller.principal_id, "creator_binding_id": binding_id, "app_id": app_id,
                "provenance": provenance, "type": spec.schedule_type, "paused": False,
                "next_fire_at": first, "created_at": now, "updated_at": now, **values})
        self.on_changed()
        return await self.get(caller, sid)

    async def _chat_timezone(self, conn: Connection, spec: ScheduleSpec, values: dict[str, Any],
                             provenance: dict[str, Any], app_id: str, now: datetime) -> datetime | None:
        """A schedule made from a Feishu chat (a Turn's or a form's receipt) naming no timezone takes its
        application's `timezone`: rule, first fire and quiet hours follow it. Return the new first fire time."""
        zone = next((a.timezone for a in (self.feishu.apps if self.feishu is not None else []) if a.app_id == app_id),
                    None) or await self.store.app_timezone(conn, app_id)  # the console's own application
        if not zone or zone == spec.timezone:
            return None
        rule = rules.parse(str(spec.rule), zone)
        first = rules.first_fire(rule, now, now)
        if first is None:
            raise Invalid(f"rule {spec.rule!r} has no future fire time in {zone} (the application's timezone); "
                          f"pick a later time or pass a timezone")
        spec.timezone = values["timezone"] = zone
        values["rule"] = rule.text
        provenance["timezone"] = {"basis": "app", "app_id": app_id, "timezone": zone}
        return first

    async def update(self, caller: Caller, schedule_id: str, spec: ScheduleSpec) -> ScheduleView:
        """Change a definition; given fields replace the saved ones ("" clears a choice), the rule restarts from now."""
        now = self.clock.now()
        async with self.db.read() as conn:
            row = await self.access.schedule(conn, caller, schedule_id)
        merged = ScheduleSpec(schedule_type=row.type, **{k: getattr(row, k) for k in
                              ("name", "prompt", "rule", "timezone", "session_ref", "notify", "overlap") + CHOICES})
        changed = {}
        for f in fields(ScheduleSpec):
            value = getattr(spec, f.name)
            if value is None:
                continue
            if f.name == "schedule_type" and value != row.type:
                raise Invalid("schedule_type cannot change; delete this schedule and create a new one")
            value = None if value == "" and f.name in CHOICES + ("session_ref",) else value
            setattr(merged, f.name, value)
            changed[f.name] = value
        if not changed:
            raise Invalid("nothing to update; pass at least one field to change")
        first = await self._validate(caller, merged, now, utc(row.created_at))
        values = {k: getattr(merged, k) for k in ("name", "prompt", "timezone", "session_ref", "notify", "overlap")
                  + CHOICES}
        values["rule"] = rules.parse(merged.rule, merged.timezone).text
        if {"rule", "timezone"} & set(changed):
            values["next_fire_at"] = None if row.paused else first
        async with self.db.write() as conn:
            await self.access.schedule(conn, caller, schedule_id, lock=True)
            await self.store.update(conn, schedule_id, {"updated_at": now, **values})
        self.on_changed()
        return await self.get(caller, schedule_id)

    async def pause(self, caller: Caller, schedule_id: str) -> ScheduleView:
        """Stop future dispatch; an already admitted Task keeps running."""
        return await self._set_paused(caller, schedule_id, True)

    async def resume(self, caller: Caller, schedule_id: str) -> ScheduleView:
        """Dispatch again from the next future fire time (times passed while paused are not missed runs)."""
        return await self._set_paused(caller, schedule_id, False)

    async def _set_paused(self, caller: Caller, schedule_id: str, paused: bool) -> ScheduleView:
        now = self.clock.now()
        async with self.db.write() as conn:
            row = await self.access.schedule(conn, caller, schedule_id, lock=True)
            values: dict[str, Any] = {"paused": paused, "updated_at": now}
            if not paused and row.paused:
                rule = rules.parse(row.rule, row.timezone)
                values["next_fire_at"] = rules.next_after(rule, now, utc(row.created_at))
            await self.store.update(conn, schedule_id, values)
        self.on_changed()
        return await self.get(caller, schedule_id)

    async def delete(self, caller: Caller, schedule_id: str) -> dict:
        """Delete a schedule (its history stays); an already admitted Task keeps running."""
        now = self.clock.now()
        async with self.db.write() as conn:
            await self.access.schedule(conn, caller, schedule_id, lock=True)
            await self.store.mark_deleted(conn, schedule_id, now)
        return {"schedule_id": schedule_id, "deleted": True}

    async def run_now(self, caller: Caller, schedule_id: str) -> dict:
        """Fire the caller's schedule once, now: a manual firing, ledgered and correlated to its Task like any other
        (same admission and alert rules), the rule's next fire time unmoved. Return the firing."""
        async with self.db.read() as conn:
            await self.access.schedule(conn, caller, schedule_id)
        if self.firing is None:
            raise Invalid("running a schedule now needs the hub's firing loop, which this process does not run")
        firing_id = await self.firing.run_now(schedule_id)
        async with self.db.read() as conn:
            return firing_view(await self.firings.get_firing(conn, firing_id))

    # ------------------------------------------------------------ reads

    async def get(self, caller: Caller, schedule_id: str) -> ScheduleView:
        """Return a schedule with its saved choices as given, and where its notices go (or why they do not)."""
        async with self.db.read() as conn:
            row = await self.access.schedule(conn, caller, schedule_id)
            creator = await self.store.creator_name(conn, row.creator_id)
            apps = [a.app_id for a in self.feishu.apps] if self.feishu is not None else []
            notices = (await route(conn, row, apps, SqlIncidentStore(self.db))).view()
        return self._view(row, creator).model_copy(update={"notifications": ScheduleNotifications(**notices)})

    async def list(self, caller: Caller, limit: int = 100, all_principals: bool = False) -> list[ScheduleView]:
        """Return the caller's schedules (an admin may ask for everyone's), newest first."""
        async with self.db.read() as conn:
            v = await self.access.visibility(conn, caller, everyone=all_principals)
            rows = await self.store.visible(conn, v, limit=max(1, min(int(limit), 1000)))
        return [self._view(r, r.creator_name) for r in rows]

    @staticmethod
    def _view(row: Any, creator: str | None) -> ScheduleView:
        one_shot = row.rule.lower().startswith("at ")
        return ScheduleView(
            schedule_id=row.id, name=row.name, schedule_type=row.type, session_ref=row.session_ref,
            prompt=row.prompt, rule=row.rule, timezone=row.timezone, one_shot=one_shot,
            paused=row.paused, next_fire_at=iso(row.next_fire_at), notify=row.notify, overlap=row.overlap,
            consumed=one_shot and row.next_fire_at is None and not row.paused,
            profile=row.profile, runtime=row.runtime, model=row.model, reasoning_effort=row.reasoning_effort,
            extra_args=row.extra_args, permission_policy=row.permission_policy,
            credential_profile=row.credential_profile, timeout_s=row.timeout_s,
            creator=creator, creator_id=row.creator_id, app_id=row.app_id,
            created_at=iso(row.created_at), updated_at=iso(row.updated_at))

    async def history(self, caller: Caller, schedule_id: str, cursor: int = 0, limit: int = 50) -> dict:
        """Return firings newest first: nominal time, admission, Task or Turn, reconciled outcome."""
        if not isinstance(cursor, int) or cursor < 0:
            raise Invalid("cursor must be a non-negative integer (the next_cursor of the previous page, or 0)")
        limit = max(1, min(int(limit), 500))
        async with self.db.read() as conn:
            await self.access.schedule(conn, caller, schedule_id, include_deleted=True)
            # ledger firings + uncorrelated legacy submissions
            rows = await self.firings.history(conn, schedule_id, offset=cursor, limit=limit + 1)
        more = len(rows) > limit
        return {"schedule_id": schedule_id, "firings": [firing_view(f) for f in rows[:limit]],
                "next_cursor": cursor + limit if more else None}

    # ------------------------------------------------------------ personal views (the bot's cards)

    async def summary(self, caller: Caller, *, incidents_of: str | None = None, latest: int = 5) -> Summary:
        """Return the caller's overview: schedule, failing and paused counts, the `latest` outcomes; with
        `incidents_of` (an administrator's application) also its active incidents."""
        async with self.db.read() as conn:
            v = await self.access.visibility(conn, caller)
            rows = await self.store.visible(conn, v, limit=None)
            names = {r.id: r.name for r in rows}
            recent = await self.firings.recent(conn, list(names), limit=200)
            active = await self.store.active_incident_count(conn, incidents_of) if incidents_of else 0
        return Summary(total=len(rows), failing=failing(recent), paused=sum(1 for r in rows if r.paused),
                       latest=tuple(firing_line(f, names[f.schedule_id]) for f in recent[:latest]),
                       active_incidents=active)

    async def page(self, caller: Caller, page: int, per_page: int) -> SchedulePage:
        """Return one page of the caller's schedules, newest first, each with its last firing's state."""
        async with self.db.read() as conn:
            v = await self.access.visibility(conn, caller)
            total = await self.store.count_visible(conn, v)
            pages = max(1, -(-total // per_page))
            page = min(page, pages - 1)
            items = []
            for r in await self.store.visible(conn, v, limit=per_page, offset=page * per_page):
                last = await self.firings.latest(conn, r.id)
                items.append(ScheduleLine(schedule_id=r.id, name=r.name, rule=r.rule, paused=r.paused,
                                          next_fire_at=r.next_fire_at, timezone=r.timezone,
                                          last_state=firing_line(last, r.name).state if last else None))
        return SchedulePage(items=tuple(items), page=page, pages=pages, total=total)

    async def card(self, caller: Caller, schedule_id: str, *, include_deleted: bool = False,
                   recent: int = 5) -> ScheduleCard:
        """Return one schedule the caller may see with its `recent` latest firings, or refuse with NotFound."""
        async with self.db.read() as conn:
            row = await self.access.schedule(conn, caller, schedule_id, include_deleted=include_deleted)
            fired = await self.firings.recent(conn, [row.id], limit=recent) if recent else []
        return ScheduleCard(schedule_id=row.id, name=row.name, rule=row.rule, timezone=row.timezone,
                            schedule_type=row.type, paused=row.paused, next_fire_at=row.next_fire_at,
                            notify=row.notify, overlap=row.overlap, deleted=row.deleted_at is not None,
                            recent=tuple(firing_line(f, row.name) for f in fired))

    async def result_page(self, caller: Caller, schedule_id: str, page: int) -> ResultPage:
        """Return the result of the caller's schedule's `page`-th newest firing with a Task (clamped to the last)."""
        async with self.db.read() as conn:
            row = await self.access.schedule(conn, caller, schedule_id)
            pages = await self.firings.count_with_task(conn, row.id)
            if not pages:
                return ResultPage(schedule_id=row.id, name=row.name, page=0, pages=0, timezone=row.timezone)
            page = min(page, pages - 1)
            f = await self.firings.nth_with_task(conn, row.id, page)
            # The Task was admitted for this schedule's frozen creator, who is the caller (checked above).
            text = await self.store.task_result_text(conn, f.task_id) if f is not None else None
        return ResultPage(schedule_id=row.id, name=row.name, page=page, pages=pages, timezone=row.timezone,
                          firing=firing_line(f, row.name) if f is not None else None, text=text or "",
                          task_id=(f.task_id or "") if f is not None else "")


def firing_view(f: Any) -> dict:
    """Render one ledger row; `receipt` spells `ok:task:<id>` / `ok:turn:<id>` for admitted firings."""
    receipt = f.admission
    if f.admission == "ok":
        receipt = f"ok:task:{f.task_id}" if f.task_id else f"ok:turn:{f.turn_id}"
    return {"firing_id": f.id, "nominal_time": iso(f.nominal_time), "fired_at": iso(f.fired_at),
            "admission": f.admission, "receipt": receipt, "task_id": f.task_id, "turn_id": f.turn_id,
            "outcome": f.outcome, "missed_count": f.missed_count, "reconciled_at": iso(f.reconciled_at),
            "legacy": f.legacy, "manual": bool(getattr(f, "manual", False))}
