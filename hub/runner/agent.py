"""The runner: connects out to the hub, launches engines and streams canonical events back."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import platform
import shutil
import socket
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, cast

import aiohttp
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception
from yarl import URL

from ..backoff import RECONNECT
from ..clock import Clock, SystemClock, within
from ..domain import isolation as modes
from ..domain.durations import duration_text
from ..domain.events import turn_usage
from ..domain.limits import Limits, default_limits
from ..domain.timeline import raw_payload
from ..domain.policy import normalize_native_args
from ..engines.base import Engine, EngineResult, Job, PermissionReply
from ..engines.environment import base_env
from ..errors import AmuxError
from . import boundary as dac
from . import confine
from . import protocol as p
from .egress import Egress

log = logging.getLogger("amux.runner")


class RunnerRefused(AmuxError):
    """The hub will not take this runner (token refused or revoked, name owned by another): reconnecting cannot help."""

    status = 403
    code = "runner_refused"
REVOKED_CLOSE = 4401  # the hub's close code for a revoked token

QUESTION_DIAGNOSTIC = p.QUESTION_DIAGNOSTIC
STEER_TAKE_S = 3.0  # an engine confirms a correction within this (the hub waits `steer_wait_s`, 5 s, for the answer)


def asked_question(payload: dict) -> p.Question:
    """The question event's payload as the Finished report carries it (text and option labels, bounded)."""
    options = [str(o)[:200] for o in payload.get("options") or [] if str(o).strip()][:50]
    return p.Question(text=str(payload.get("text") or "")[:20_000], options=options,
                      free_text=payload.get("free_text") is not False)


@dataclass
class _Held:
    """A task this runner holds until the hub acknowledges its final report."""

    task_id: str
    attempt: int
    rseq: int = 0
    unacked: list[dict] = field(default_factory=list)
    pending_events: list[p.Event] = field(default_factory=list)
    task: asyncio.Task | None = None
    replies: asyncio.Queue = field(default_factory=asyncio.Queue)
    job: Job | None = None  # the launched engine's job (its `steer_into` takes corrections mid-turn)
    steer_refusal: str | None = None  # why this run's engine cannot take a correction mid-turn at all
    steers_taken: set[str] = field(default_factory=set)  # steer ids its engine took: a resent one is not fed again
    cancel_intent: bool = False
    finished: bool = False
    # Set when the hub has committed that this attempt holds the reservation (the Ack of its Accepted): the engine
    # launches only then. A refusal (`drop`) cancels the attempt before anything ran.
    confirmed: asyncio.Event = field(default_factory=asyncio.Event)


class Redactor:
    """Replace credential values wherever they would leave the runner (events, results, errors)."""

    def __init__(self, secrets: Iterable[object]) -> None:
        self.secrets = sorted((s for s in secrets if isinstance(s, str) and len(s) >= 4), key=len, reverse=True)

    def scrub(self, value: Any) -> Any:
        """Return `value` with every secret replaced by [redacted], recursively."""
        if not self.secrets or value is None:
            return value
        if isinstance(value, str):
            for secret in self.secrets:
                value = value.replace(secret, "[redacted]")
            return value
        if isinstance(value, dict):
            return {k: self.scrub(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.scrub(v) for v in value]
        return value


def launch_env(d: p.Dispatch, home: Path | None = None, engine: Engine | None = None,
               source: dict[str, str] | None = None, share_login: bool = False) -> dict[str, str]:
    """The child's whole environment: the allowlist, HOME = the run's folder, what the engine needs to find
    its config (only when the operator shares the runner's own engine login, `share_login`), the policy's native
    variables (IS_SANDBOX=1 for Claude bypass as root), then the dispatch's credentials and coordination
    variables. Nothing else of the runner's."""
    snap = d.snapshot
    src = dict(os.environ if source is None else source)
    env = base_env(src)
    # Children find `amux` (e.g. `amux memory`) next to the runner's interpreter.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    config = getattr(engine, "config_env", None)
    if share_login and callable(config):
        env.update(config(src))
    if home is not None:
        env["HOME"] = str(home)
    env.update(snap.get("native_env", {}))
    env.update(d.env)
    if os.geteuid() == 0 and snap.get("engine") and snap.get("permission_policy"):
        env.update(normalize_native_args(snap["engine"], snap["permission_policy"], [], as_root=True).env)
    return env


def run_home(root: Path, d: p.Dispatch) -> tuple[Path, bool]:
    """Return the run's HOME (0700) and whether it is the run's alone (removed at its end).

    A session's turns and an instance's runs keep one HOME (engines keep their resume state there);
    a plain task gets a fresh one.
    """
    key = d.snapshot.get("workspace_key")
    home = root / (key or f"{d.task_id}.{d.attempt}")
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    return home, key is None


def launch_prompt(d: p.Dispatch) -> str:
    """The prompt the engine sees: the profile's expert instructions first (scripts stay scripts)."""
    instructions = (d.snapshot.get("profile") or {}).get("instructions") or ""
    if not instructions or d.snapshot.get("engine") == "scripted":
        return d.prompt
    return f"{instructions}\n\n{d.prompt}"


def snapshot_tree(root: Path) -> dict[str, tuple[int, int]]:
    """Map each file under `root` to (size, mtime_ns) for changed-file evidence."""
    out: dict[str, tuple[int, int]] = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            full = Path(dirpath) / name
            try:
                st = full.stat()
            except OSError:
                continue
            out[str(full.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


def _empty(folder: Path) -> bool:
    """Say whether `folder` has no entries (one directory entry read; a missing folder counts as empty)."""
    try:
        with os.scandir(folder) as entries:
            return next(entries, None) is None
    except OSError:
        return True


async def tree_of(root: Path) -> dict[str, tuple[int, int]]:
    """`snapshot_tree(root)` in a thread (a big tree must not stall the loop); an empty folder is answered at once."""
    return {} if _empty(root) else await asyncio.to_thread(snapshot_tree, root)


async def remove_tree(folder: Path) -> None:
    """Remove a run's folder in a thread; an empty one at once."""
    if _empty(folder):
        with contextlib.suppress(OSError):
            folder.rmdir()
        return
    await asyncio.to_thread(shutil.rmtree, folder, True)


def diff_trees(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> dict[str, list[str]]:
    """Return created, modified and deleted paths."""
    return {
        "created": sorted(set(after) - set(before)),
        "modified": sorted(k for k in set(after) & set(before) if after[k] != before[k]),
        "deleted": sorted(set(before) - set(after)),
    }


class Silence:
    """How long an engine has said nothing (read on the injected clock), and the status events that say so.

    Every event the engine emits is output; the notices themselves are not. A notice goes out each time the
    silence reaches another whole `stall_s` (5 min, 10 min, ...), so a stalled run is visible long before its
    timeout, and a run that talks again starts over.
    """

    def __init__(self, clock: Clock, stall_s: float, engine: str) -> None:
        self.clock = clock
        self.stall_s = stall_s
        self.engine = engine
        self.last = clock.now()
        self.noticed = 0  # whole stall periods of the current silence already announced

    def heard(self) -> None:
        """Record engine output now: the silence starts over."""
        self.last = self.clock.now()
        self.noticed = 0

    def silent_s(self) -> float:
        """Return the seconds since the engine's last output (or its launch)."""
        return (self.clock.now() - self.last).total_seconds()

    def stalled(self) -> bool:
        """Say whether the engine has been silent for at least the stall time."""
        return self.stall_s > 0 and self.silent_s() >= self.stall_s

    def notice(self) -> str:
        """Say how long the engine has been silent, in whole stall periods (`5 min`, `10 min`), readably."""
        silent = self.silent_s()
        if self.stall_s > 0:
            silent = (silent // self.stall_s) * self.stall_s
        return f"no output from {self.engine} for {duration_text(silent)}"

    async def watch(self, record: Callable[[str, dict], None]) -> None:
        """Emit a status event each time the silence reaches another whole stall period, until cancelled."""
        if self.stall_s <= 0:
            return
        poll = min(max(self.stall_s / 4, 0.05), 1.0)
        while True:
            await asyncio.sleep(poll)
            periods = int(self.silent_s() // self.stall_s)
            if periods > self.noticed:
                self.noticed = periods
                record("status", {"text": self.notice(),
                                  "stall": {"engine": self.engine, "silent_s": int(self.silent_s())}})


class Runner:
    """One runner process (or the in-process runner of `amux up`): the same protocol either way."""

    def __init__(self, hub_url: str, token: str, *, name: str, slots: int, workspace_root: Path,
                 engines: dict[str, Engine], home_root: Path | None = None, authoring: bool = False,
                 dedicated: bool = False, isolation: list[str] | None = None, child_network: str = "isolated",
                 egress_allow: tuple[str, ...] = (), in_hub_process: bool = False, hide: tuple[Path, ...] = (),
                 share_engine_login: bool = False, stall_notice_s: float = 300.0, clock: Clock | None = None,
                 limits: Limits | None = None, cgroup_parent: Path | None = None) -> None:
        self.hub_url = hub_url.rstrip("/")
        # A run whose engine has said nothing for this long gets a status event (and a timeout names the stall).
        self.stall_notice_s = float(stall_notice_s)
        self.clock = clock or SystemClock()
        # Execution modes (README "Execution modes"): what the operator asked this runner to offer, and how.
        self.dedicated = dedicated
        self.wanted = [m for m in (isolation or modes.MODES)]
        unknown = [m for m in self.wanted if m not in modes.MODES]
        if unknown:
            raise AmuxError(f"unknown isolation mode {unknown[0]!r}; offer {' and/or '.join(modes.MODES)}")
        self.child_network = child_network
        self.egress_allow = tuple(egress_allow)
        self.in_hub_process = in_hub_process
        self.share_engine_login = share_engine_login
        self._modes: tuple[list[str], dict[str, str]] | None = None
        self._unusable: dict[str, dict[str, str]] = {}  # engine -> mode -> why its CLI cannot run in that sandbox
        # Each child's ceilings (README "Resource limits"); a profile or request may only lower them.
        self.limits = (limits or Limits()).otherwise(default_limits())
        self.cgroup_parent = cgroup_parent  # a group delegated to this (non-root) runner's user
        self._how: dict[str, str] | None = None  # how each limit is enforced here (probed once)
        # The operator's opt-in (`amux runner --authoring`): profiles with local expert authoring may run here.
        self.authoring = authoring
        self.token = token
        self.name = name
        self.slots = slots
        self.workspace_root = Path(workspace_root)
        # Task children's HOME folders: never the runner's own home.
        self.home_root = (Path(home_root) if home_root
                          else self.workspace_root.parent / f"{self.workspace_root.name}-homes")
        self.engines = {k: e for k, e in engines.items() if e.available()}
        # Masked inside a linux-dac child even where a revealed folder would show them.
        self.hide = tuple(Path(h).resolve() for h in hide) + (self.workspace_root.resolve(), self.home_root.resolve())
        self.held: dict[str, _Held] = {}
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.runtime_id: str | None = None
        self.heartbeat_s = 5.0
        self.registered = asyncio.Event()
        self._stop = asyncio.Event()
        self._outq: list[dict] = []
        self._revoked = False
        self._steering: set[asyncio.Future[None]] = set()

    def modes(self) -> tuple[list[str], dict[str, str]]:
        """Return the execution modes this runner offers and why it offers none of the others (probed once, logged)."""
        if self._modes is None:
            offered: list[str] = []
            unavailable: dict[str, str] = {}
            for mode in modes.MODES:
                if mode not in self.wanted:
                    unavailable[mode] = f"the operator did not offer {mode} on this runner (--isolation)"
                    continue
                why = (dac.unavailable(mode) if mode in modes.CONTAINED
                       else None if self.dedicated else modes.NOT_DEDICATED)
                if why is None:
                    offered.append(mode)
                else:
                    unavailable[mode] = why
            self._modes = (offered, unavailable)
            log.info("runner %s offers isolation %s%s", self.name, ", ".join(offered) or "none",
                     "".join(f"; not {m}: {why}" for m, why in unavailable.items()))
            if not offered:  # said once, at start: every task that needs a mode is refused at admission
                log.warning("runner %s can run no task child: %s", self.name,
                            "; ".join(f"{m}: {why}" for m, why in unavailable.items()))
            self._unusable = self._probe_engines(offered)
            if modes.PROCESS in offered:
                log.warning("runner %s is declared dedicated: process-mode children run as this runner's own uid "
                            "(%d) and can read whatever it can", self.name, os.geteuid())
        return self._modes

    def _probe_engines(self, offered: list[str]) -> dict[str, dict[str, str]]:
        """Check, once at start, that each CLI engine can be launched inside each sandbox mode offered; say what
        cannot (its path and the fix), so that such a run fails naming it instead of a raw "Permission denied"."""
        out: dict[str, dict[str, str]] = {}
        path_env = os.environ.get("PATH", os.defpath)
        for name, engine in sorted(self.engines.items()):
            binary = getattr(engine, "binary", None)
            if not callable(binary):
                continue  # the scripted engine runs the runner's own interpreter
            for mode in (m for m in offered if m in modes.CONTAINED):
                why = dac.cannot_launch(name, binary(), path_env, mode, self.hide)
                if why is not None:
                    log.error("runner %s: %s", self.name, why)
                    out.setdefault(name, {})[mode] = why
        return out

    def enforcement(self) -> dict[str, str]:
        """Say how this runner enforces each limit (a cgroup per run, or rlimits), probed once and logged."""
        if self._how is None:
            self._how = confine.mechanism(self.limits, self.cgroup_parent)
            log.info("runner %s limits each child to %s (%s)", self.name, self.limits.text(),
                     ", ".join(f"{k}: {v}" for k, v in self._how.items()))
        return self._how

    def capabilities(self) -> dict[str, Any]:
        """Describe what this runner can do."""
        self.workspace_root.mkdir(parents=True, exist_ok=True)
        offered, unavailable = self.modes()
        limits = {**(self.limits.snapshot() or {}), "mechanism": self.enforcement()}
        return {
            "platform": platform.system().lower(),
            "arch": platform.machine(),
            "engines": sorted(self.engines),
            "workspace_root": str(self.workspace_root),
            "workspace_writable": os.access(self.workspace_root, os.W_OK),
            "isolation": offered,
            "isolation_unavailable": unavailable,
            "engines_unusable": self._unusable,  # {engine: {mode: why}}: found at start, named to each run
            "limits": limits,  # each child's ceilings and how they are enforced
            "uid": os.geteuid(),
            "host": socket.gethostname(),
            "in_hub_process": self.in_hub_process,
            "memory_cli": (Path(sys.executable).parent / "amux").exists(),
            "authoring": self.authoring,
        }

    async def run_forever(self) -> None:
        """Connect, serve, and reconnect with backoff (`hub.backoff.RECONNECT`) until stopped; a refusal
        (`RunnerRefused`: a revoked token, a name taken) is raised, never retried."""
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {self.token}"}) as http:
            while not self._stop.is_set():
                # A fresh schedule per served session: a session that ended cleanly starts again from 0.1 s.
                retrying = AsyncRetrying(
                    retry=retry_if_exception(lambda e: isinstance(e, Exception) and not isinstance(e, RunnerRefused)),
                    wait=RECONNECT, stop=lambda _rs: self._stop.is_set(), before_sleep=self._log_retry,
                    retry_error_callback=lambda _rs: None)  # stopped while failing: end quietly
                await retrying(self._connect_once, http)
                if not self._stop.is_set():
                    await asyncio.sleep(RECONNECT(RetryCallState(retrying, None, (), {})))

    async def _connect_once(self, http: aiohttp.ClientSession) -> None:
        """Serve one connection until it ends; turn a refused token into `RunnerRefused`."""
        try:
            await self._session(http)
        except aiohttp.WSServerHandshakeError as e:
            if e.status in (401, 403):  # a revoked or wrong token: retrying cannot help
                self._give_up()
                raise RunnerRefused(f"hub refused the runner's token ({e.status}: revoked or invalid); "
                                    "create a new one with `amux token create --principal NAME "
                                    "--runner`") from e
            raise
        except RunnerRefused as e:
            log.error("%s", e.message)
            self._give_up()
            raise
        finally:
            self.ws = None
            self.registered.clear()

    @staticmethod
    def _log_retry(rs: RetryCallState) -> None:
        e = rs.outcome.exception() if rs.outcome else None
        delay = rs.next_action.sleep if rs.next_action else 0.0
        if isinstance(e, aiohttp.WSServerHandshakeError):
            log.info("hub refused the connection (%s); retrying in %.1fs", e.status, delay)
        elif isinstance(e, (aiohttp.ClientError, OSError, asyncio.TimeoutError)):
            log.info("hub unreachable (%s); retrying in %.1fs", e, delay)
        else:  # a protocol surprise (a proxy's error page mid-stream): reconnect
            log.warning("connection to the hub failed (%s: %s); retrying in %.1fs", type(e).__name__, e, delay)

    def _give_up(self) -> None:
        """Cancel what this runner runs: nothing it runs could report any more."""
        for h in self.held.values():
            if h.task and not h.task.done():
                h.task.cancel()

    async def stop(self) -> None:
        """Stop connecting and cancel held work."""
        self._stop.set()
        for h in self.held.values():
            if h.task and not h.task.done():
                h.task.cancel()
        if self.ws is not None:
            await self.ws.close()

    async def _session(self, http: aiohttp.ClientSession) -> None:
        url = self.hub_url.replace("http://", "ws://").replace("https://", "wss://") + "/runner/ws"
        async with http.ws_connect(url, heartbeat=30, max_msg_size=16 * 1024 * 1024) as ws:
            reg = p.Register(name=self.name, slots=self.slots, capabilities=self.capabilities(),
                             running=[p.RunningWork(task_id=h.task_id, attempt=h.attempt) for h in self.held.values()])
            await ws.send_json(reg.model_dump())
            first = await ws.receive_json(timeout=30)
            if first.get("type") == "error":
                if first.get("code") == "retry":  # the hub could not register it just now (its database): reconnect
                    raise ConnectionError(f"hub could not register the runner yet: {first.get('message')}")
                raise RunnerRefused(f"hub refused the runner: {first.get('message')}")
            registered = p.Registered.model_validate(first)
            self.runtime_id, self.heartbeat_s = registered.runtime_id, registered.heartbeat_s
            for task_id in registered.drop:
                self._drop(task_id)
            self.ws = ws
            self.registered.set()
            self._outq = []
            resend = [msg for h in list(self.held.values()) for msg in h.unacked]
            if resend:  # what the hub has not acknowledged, in order
                await ws.send_json({"type": "batch", "messages": resend})
            beat = asyncio.create_task(self._heartbeat(ws))
            try:
                async for raw in ws:
                    if raw.type != aiohttp.WSMsgType.TEXT:
                        break
                    await self._on_message(raw.json())
            finally:
                beat.cancel()
                self.ws = None
            if ws.close_code == REVOKED_CLOSE or self._revoked:
                raise RunnerRefused("hub closed the connection: this runner's token was revoked; "
                                    "create a new one with `amux token create --principal NAME --runner`")

    async def _heartbeat(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        while not ws.closed:
            await asyncio.sleep(self.heartbeat_s)
            await ws.send_json(p.Heartbeat().model_dump())  # straight out: not part of any task's unacked log

    async def _on_message(self, msg: dict) -> None:
        kind = msg.get("type")
        if kind == "batch":
            for inner in msg.get("messages", []):
                await self._on_message(inner)
        elif kind == "dispatch":
            self._start(p.Dispatch.model_validate(msg))
        elif kind == "permission":
            answer = p.PermissionAnswer.model_validate(msg)
            h = self._holding(answer.task_id, answer.attempt)
            if h is not None:
                h.replies.put_nowait(PermissionReply(answer.request_id, answer.allow, answer.message))
        elif kind == "steer":
            steer = p.Steer.model_validate(msg)
            # An engine may take a moment (a JSON-RPC answer); messages after it are not held up meanwhile.
            task = asyncio.ensure_future(self._steer(steer))
            self._steering.add(task)
            task.add_done_callback(self._steering.discard)
        elif kind == "cancel":
            cancel = p.Cancel.model_validate(msg)
            h = self._holding(cancel.task_id, cancel.attempt)
            if h and h.task and not h.task.done():
                h.cancel_intent = True  # recorded first: the run finishes cancelled whatever the engine says
                h.task.cancel()
        elif kind == "ack":
            ack = p.Ack.model_validate(msg)
            h = self.held.get(ack.task_id)
            if h is None or (ack.attempt is not None and ack.attempt != h.attempt):
                return  # about an attempt this runner no longer runs: the one it runs now is not touched
            if ack.drop:
                self._drop(ack.task_id)
                return
            h.confirmed.set()  # any acknowledgement of this attempt covers its Accepted (rseq 0)
            h.unacked = [m for m in h.unacked if m.get("rseq", m.get("last_rseq", 0)) > ack.rseq]
            if h.finished and not h.unacked:
                self.held.pop(ack.task_id, None)
        elif kind == "error":
            log.warning("hub: %s", msg.get("message"))
            if msg.get("code") == "token_revoked":
                self._revoked = True

    def _holding(self, task_id: str, attempt: int | None) -> _Held | None:
        """The attempt this runner holds that a message names (a message for another attempt acts on nothing)."""
        h = self.held.get(task_id)
        if h is not None and attempt is not None and attempt != h.attempt:
            log.info("task %s: a message for attempt %d left attempt %d alone", task_id, attempt, h.attempt)
            return None
        return h

    async def _steer(self, steer: p.Steer) -> None:
        """Hand a correction to the running turn's engine and tell the hub whether it took it, or why not."""
        h = self._holding(steer.task_id, steer.attempt)
        if h is not None and steer.steer_id in h.steers_taken:
            reason: str | None = None  # the hub sent it again (a lost Steered): the engine has it already
        elif h is None or h.finished or h.task is None or h.task.done():
            reason = "the run has ended; the correction waits for the next prompt"
        elif h.job is None or h.job.steer_into is None:
            reason = h.steer_refusal or "the engine is not yet (or no longer) in its turn; the correction waits"
        else:
            try:
                h.steers_taken.add(steer.steer_id)  # before the await: a copy arriving meanwhile is not fed too
                reason = await within(h.job.steer_into(steer.text), STEER_TAKE_S)
                if reason is not None:
                    h.steers_taken.discard(steer.steer_id)
            except asyncio.TimeoutError:
                reason = f"the engine did not confirm the correction within {STEER_TAKE_S:g} s"
            except Exception as e:  # noqa: BLE001 — an adapter's failure is this steer's, never the runner's
                reason = f"the engine could not take the correction ({type(e).__name__}: {e})"
        if self.ws is not None and not self.ws.closed:
            await self.ws.send_json(p.Steered(task_id=steer.task_id, steer_id=steer.steer_id, delivered=reason is None,
                                              reason=reason).model_dump())

    def _drop(self, task_id: str) -> None:
        h = self.held.pop(task_id, None)
        if h and h.task and not h.task.done():
            if not h.confirmed.is_set():
                log.info("task %s attempt %d: the hub says this attempt no longer holds it; not launched",
                         task_id, h.attempt)
            h.task.cancel()

    def _start(self, d: p.Dispatch) -> None:
        existing = self.held.get(d.task_id)
        if existing and existing.attempt == d.attempt:
            return  # a resent dispatch: already running
        if existing:
            self._drop(d.task_id)
        h = _Held(d.task_id, d.attempt)
        self.held[d.task_id] = h
        h.task = asyncio.create_task(self._execute(h, d))

    def _refusal(self, d: p.Dispatch, mode: str | None) -> str | None:
        """Say why this runner must not launch the dispatch in its frozen mode (None: it may)."""
        if mode is None:
            return None
        offered, unavailable = self.modes()
        if mode not in offered:
            return (f"runner {self.name} does not offer isolation {mode}: {unavailable.get(mode, 'not offered')}; "
                    "resubmit the task for a runtime that offers it")
        if mode == modes.LINUX_DAC and d.uid is None:
            return "the hub sent a linux-dac run without its owner's uid; upgrade the hub to the runner's version"
        if mode in modes.CONTAINED and not d.principal:
            return f"the hub sent a {mode} run without its owner; upgrade the hub to the runner's version"
        return None

    def _sandbox_home(self, d: p.Dispatch, mode: str) -> Path:
        """The principal's own persistent home of a sandboxed run: by uid (linux-dac), else by principal id."""
        if mode == modes.LINUX_DAC:
            return self.home_root / f"uid-{d.uid}"
        return self.home_root / ("principal-" + "".join(c if c.isalnum() or c in "_-" else "_"
                                                        for c in str(d.principal)))

    async def _boundary(self, d: p.Dispatch, uid: int | None, workspace: Path,
                        home: Path) -> tuple[dac.Boundary, Egress | None]:
        """Build the run's sandbox boundary (linux-dac: `uid`; userns: None) and, on an isolated network, start
        its bridges."""
        reveal = tuple(dac.runner_roots())
        if self.child_network != "isolated":
            return dac.Boundary(uid, workspace, home, reveal, self.hide, network="host"), None
        url = URL(d.env.get("AMUX_HUB_URL") or self.hub_url)
        hub = (url.host, url.port) if url.scheme == "http" and url.host is not None and url.port is not None else None
        plain = hub is not None
        allow = self.egress_allow + (() if plain else (f"{url.host}:{url.port}",))
        egress = Egress(Path(tempfile.mkdtemp(prefix="amux-b-")), hub, allow)
        await egress.start()
        port = dac.inside_port(url.port, uid) if url.port is not None else None
        extra = {"AMUX_HUB_URL": str(url.with_host("127.0.0.1").with_port(port))} if plain else {}
        return dac.Boundary(uid, workspace, home, reveal, self.hide, network="isolated", bridge=egress.folder,
                            hub_port=port if plain else None, extra_env=extra), egress

    async def _confine(self, d: p.Dispatch, record: Callable[[str, dict], None]) -> confine.Watch:
        """Make the run's limits (the lower of the snapshot's and this runner's, as the task view shows them:
        `hub.domain.limits.applied_limits`) before its child starts."""
        applied = self.limits.lowest(Limits.parse(d.snapshot.get("limits"), "the snapshot's limits"))
        c = await asyncio.to_thread(confine.start, f"{d.task_id}.{d.attempt}", applied, self.enforcement(),
                                    float(d.snapshot.get("timeout_s") or 3600), self.cgroup_parent)
        return confine.Watch(c, record)

    async def _send(self, h: _Held, msg: dict) -> None:
        """Queue a message for the hub; everything queued in one loop turn goes out as one batch."""
        h.unacked.append(msg)
        self._outq.append(msg)
        if len(self._outq) == 1:
            asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(self._flush_out()))

    async def _flush_out(self) -> None:
        batch, self._outq = self._outq, []
        if not batch or self.ws is None or self.ws.closed:
            return  # kept in `unacked`; resent after reconnect
        try:
            await self.ws.send_json(batch[0] if len(batch) == 1 else {"type": "batch", "messages": batch})
        except (ConnectionError, RuntimeError):
            pass

    async def _flush(self, h: _Held) -> None:
        if not h.pending_events:
            return
        events, h.pending_events = h.pending_events, []
        msg = p.Events(task_id=h.task_id, attempt=h.attempt, events=events).model_dump()
        msg["last_rseq"] = events[-1].rseq
        await self._send(h, msg)

    # Long by design: the engine's emit closure and the Finished report share one attempt's state.
    async def _execute(self, h: _Held, d: p.Dispatch) -> None:
        await self._send(h, {**p.Accepted(task_id=d.task_id, attempt=d.attempt).model_dump(), "rseq": 0})
        # The fence: nothing of the run happens until the hub has committed, in its database, that this attempt
        # holds the reservation. Its Accepted is resent on every reconnect; a refusal cancels this task here.
        try:
            await h.confirmed.wait()
        except asyncio.CancelledError:
            if not h.cancel_intent:
                raise
            h.rseq += 1
            h.finished = True
            await self._send(h, p.Finished(task_id=d.task_id, attempt=d.attempt, rseq=h.rseq, outcome="cancelled",
                                           error="cancelled on request before it started").model_dump())
            return
        # A session's turns and an instance's runs share the session's workspace; a plain task gets its own.
        workspace = self.workspace_root / (d.snapshot.get("workspace_key") or d.task_id)
        mode = modes.frozen_mode(d.snapshot) if modes.needs_boundary(d.snapshot) else None
        refusal = self._refusal(d, mode)
        boundary: dac.Boundary | None = None
        egress: Egress | None = None
        if mode in modes.CONTAINED and refusal is None:
            uid = d.uid if mode == modes.LINUX_DAC else None
            home, own_home = self._sandbox_home(d, mode), False  # the principal's own, kept between runs
            await asyncio.to_thread(dac.prepare, workspace, uid)
            await asyncio.to_thread(dac.prepare, home, uid)
            boundary, egress = await self._boundary(d, uid, workspace, home)
        else:
            workspace.mkdir(parents=True, exist_ok=True)
            home, own_home = run_home(self.home_root, d)
        before = await tree_of(workspace)
        engine = self.engines.get(d.snapshot.get("engine", ""))
        last_usage: dict | None = None
        last_status: str | None = None  # named in a timeout's error: what the engine was doing when time ran out
        asked: dict | None = None  # the agent's structured question, once it asked one

        redact = Redactor(v for k, v in d.env.items() if k not in ("AMUX_SESSION_ID", "AMUX_HUB_URL"))
        silence = Silence(self.clock, self.stall_notice_s, str(d.snapshot.get("engine") or "the engine"))

        def record(kind: str, payload: dict) -> None:
            h.rseq += 1
            h.pending_events.append(p.Event(rseq=h.rseq, type=kind, payload=payload))
            if len(h.pending_events) == 1:
                asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(self._flush(h)))

        async def emit(kind: str, payload: dict) -> None:
            nonlocal last_usage, last_status, asked
            silence.heard()
            payload = redact.scrub(payload)
            if kind == "tool":  # its raw input and output (the Agent Timeline's) leave bounded, tokens cut
                payload = raw_payload(payload)
            if kind == "status" and isinstance(payload.get("text"), str):
                last_status = payload["text"]
            if kind == "usage":
                # Every engine path (a CLI's stream, the scripted engine) keeps only known metrics; the
                # adapter has already dropped reports of another provider turn (turn_usage with its turn id).
                usage = turn_usage(payload.get("usage"))
                if not usage or usage == last_usage:
                    return
                payload = {"usage": usage}
                last_usage = usage
            if kind == "question":
                asked = payload
            record(kind, payload)

        outcome, result = "failed", EngineResult("failed")
        question: p.Question | None = None
        limited: confine.Watch | None = None  # the run's limits as applied (a run with a child)
        try:
            if refusal is not None:
                result = EngineResult("failed", error=refusal)
            elif engine is None:
                result = EngineResult("failed", error=f"engine {d.snapshot.get('engine')!r} is not installed on "
                                                      f"runner {self.name}")
            elif mode is not None and (unusable := self._unusable.get(d.snapshot.get("engine", ""), {}).get(mode)):
                result = EngineResult("failed", error=f"runner {self.name}: {unusable}")
            else:
                refusal_of = getattr(engine, "steering_refusal", None)
                h.steer_refusal = refusal_of(d.snapshot) if callable(refusal_of) else None
                share = self.share_engine_login and boundary is None
                if mode is not None:
                    limited = await self._confine(d, record)
                job = Job(d.task_id, d.attempt, launch_prompt(d), d.snapshot, workspace,
                          env=launch_env(d, home, engine, share_login=share),
                          permission_replies=h.replies, boundary=boundary,
                          confine=limited.c if limited is not None else None)
                h.job = job
                watches = [asyncio.create_task(silence.watch(record))]
                if limited is not None:
                    watches.append(asyncio.create_task(limited.run()))
                try:
                    result = await within(engine.run(job, emit), float(d.snapshot.get("timeout_s") or 3600))
                finally:
                    for watch in watches:
                        watch.cancel()
                    if limited is not None:
                        limited.check()
                if limited is not None and (killed := limited.error()) is not None:
                    result = EngineResult("failed", error=killed)
            outcome = result.outcome
            if asked is not None and d.direct_session:  # its attached person answers, as the next Turn
                outcome, result.error, question = "waiting_for_user", None, asked_question(asked)
            elif asked is not None:
                outcome, result.error = "failed", QUESTION_DIAGNOSTIC
        except asyncio.TimeoutError:
            error = (f"timed out after {duration_text(float(d.snapshot.get('timeout_s') or 3600))}"
                     + (f"; the engine stalled: {silence.notice()}" if silence.stalled() else "")
                     + (f"; last status: {last_status}" if last_status else ""))
            outcome, result = "timed_out", EngineResult("timed_out", error=error)
        except asyncio.CancelledError:
            if not h.cancel_intent:
                if egress is not None:  # dropped: its bridge sockets go with it
                    await egress.close()
                if limited is not None:
                    await asyncio.to_thread(confine.end, limited.c)
                raise
            outcome, result = "cancelled", EngineResult("cancelled", error="cancelled on request")
        except Exception as e:  # an adapter crash fails the task, never the runner
            log.exception("engine crashed")
            outcome, result = "failed", EngineResult("failed", error=f"engine crashed: {type(e).__name__}: {e}")
        if egress is not None:
            await egress.close()
        if limited is not None:  # whatever the run left in its groups dies with them
            await asyncio.to_thread(confine.end, limited.c)
        if own_home:
            await remove_tree(home)
        await self._flush(h)
        changed = diff_trees(before, await tree_of(workspace))
        h.rseq += 1
        fin = p.Finished(
            task_id=d.task_id, attempt=d.attempt, rseq=h.rseq, outcome=cast(p.Outcome, outcome),  # pydantic checks it
            result_text=redact.scrub(result.text or ""),
            result_json=redact.scrub(result.json), error=redact.scrub(result.error), usage=last_usage,
            changed_files=changed, resume_handle=result.resume_handle, question=question,
        )
        if h.job is not None:
            h.job.steer_into = None
        h.finished = True
        await self._send(h, fin.model_dump())
