"""Settings: an optional TOML file overlaid by `AMUX_*` environment variables (`__` between levels)."""
from __future__ import annotations

import ipaddress
import os
import tomllib
from pathlib import Path
from typing import Any, Mapping

from pydantic import BaseModel, Field, ValidationError, field_validator

from .errors import Invalid


class HubSettings(BaseModel):
    """Dispatch and runner timing."""

    reservation_ttl_s: float = 30.0
    runtime_lost_s: float = 60.0
    heartbeat_s: float = 5.0
    deadline_grace_s: float = 30.0
    poll_s: float = 0.25
    max_prompt_bytes: int = 256 * 1024
    max_extra_args: int = 64
    default_timeout_s: float = 3600.0
    # Fair sharing (README "Fair sharing"): placement keeps each principal to its fair share while others wait
    # (hub/domain/fair_share.py); these are operator caps on top of it, 0 = off; tokens made with --admin are exempt.
    max_running_per_principal: int = Field(default=0, ge=0)  # a cap even on an idle fleet (e.g. for cost)
    max_queued_per_principal: int = Field(default=1000, ge=0)
    queue_timeout_s: float = Field(default=1800.0, gt=0)  # a task nothing online can take fails `not placed: …`
    # Slow and idle clients (hub/web/server.py): time for a request head, for a body, for a runner's hello;
    # connections waiting for a request head at once.
    header_timeout_s: float = Field(default=15.0, gt=0)
    body_timeout_s: float = Field(default=30.0, gt=0)
    hello_timeout_s: float = Field(default=5.0, gt=0)
    max_pending_connections: int = Field(default=512, ge=1)
    # One client (remote IP address): connections waiting for a request head, connections open; 0 turns either off
    # (behind a reverse proxy every connection comes from the proxy: let the proxy limit clients instead).
    max_pending_per_client: int = Field(default=64, ge=0)
    max_connections_per_client: int = Field(default=256, ge=0)
    # `/metrics`: a bearer token Prometheus sends (unset: an admin token), and/or an address of its own that serves
    # only `/metrics` (the token, when set, is required there too).
    metrics_token: str | None = None
    metrics_listen: str | None = None
    # Proxies (IP addresses or networks) whose X-Forwarded-For names the client, for the per-client rules that run
    # after a request head arrived (OAuth registration); e.g. AMUX_HUB__TRUSTED_PROXIES=10.0.0.0/8,172.16.0.0/12
    trusted_proxies: list[str] = Field(default_factory=list)

    @field_validator("trusted_proxies", mode="before")
    @classmethod
    def _proxy_list(cls, v: Any) -> Any:
        items = [p.strip() for p in v.split(",") if p.strip()] if isinstance(v, str) else v
        for item in items or []:
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"hub.trusted_proxies: {item!r} is not an IP address or network; write e.g. "
                                 '"10.0.0.0/8" or "192.0.2.7"') from None
        return items


class PresetSettings(BaseModel):
    """A builtin launch preset (runtime, model, reasoning effort); omitted fields stay engine defaults."""

    runtime: str | None = None
    model: str | None = None
    reasoning_effort: str | None = None


class ProfileSettings(BaseModel):
    """Profile defaults of this distribution."""

    default_profile: str = "scripted"   # used when a task names no profile
    default_preset: str = "claude"      # the distribution's default builtin launch preset
    presets: dict[str, PresetSettings] = Field(default_factory=dict)
    authoring_runtime: str | None = None  # explicitly configured runtime for local expert authoring


class MemorySettings(BaseModel):
    """Hub memory scopes."""

    # On (the default): each principal's executions use that principal's own memory. Off: every principal shares one
    # global memory, an operator's explicit choice (README "Memory").
    user_isolation: bool = True


class LeaseSettings(BaseModel):
    """Task-lease clocks (seed: rift tasks)."""

    activity_granularity_s: float = 60
    takeover_quiet_s: float = 1800
    auto_close_quiet_s: float = 14400
    # Open lease tasks one principal may hold at once (README "Boxes"); 0 = no limit; admin tokens are exempt.
    max_open_tasks_per_principal: int = Field(default=20, ge=0)


class BoxSettings(BaseModel):
    """Boxes (seed: VMs): which driver runs them and the limits of each (README "Boxes")."""

    driver: str = "local"        # "local": bubblewrap sandbox; "unsandboxed": plain processes, operator opt-in
    network: str = "none"        # "none": loopback only; "host": the host's network (not its loopback services' files)
    max_per_task: int = Field(default=0, ge=0)       # 0 = any number (the seed); the real limit is the next one
    max_live_per_principal: int = Field(default=8, ge=0)  # live boxes of one principal, all its tasks; 0 = no limit
    memory_mb: int = Field(default=1024, ge=16)      # per box (cgroup), or per process (RLIMIT_AS) without cgroups
    pids_max: int = Field(default=256, ge=8)         # processes and threads per box
    cpus: float = Field(default=1.0, gt=0)           # CPU time per box, in cores
    disk_mb: int = Field(default=1024, ge=1)         # size of the box's writable /box and of its /tmp (memory-backed)
    shm_mb: int = Field(default=64, ge=1)            # size of the box's /dev/shm (memory-backed; /dev itself is 64 KiB)
    page_size: int = Field(default=50, ge=1, le=1000)  # open tasks per Boxes page (AMUX_BOXES__PAGE_SIZE)

    @field_validator("driver")
    @classmethod
    def _known_driver(cls, v: str) -> str:
        if v not in ("local", "unsandboxed"):
            raise ValueError(f'unknown box driver {v!r}; set boxes.driver = "local" (bubblewrap sandbox) or '
                             f'"unsandboxed" (no isolation, operator opt-in), e.g. AMUX_BOXES__DRIVER=local')
        return v

    @field_validator("network")
    @classmethod
    def _known_network(cls, v: str) -> str:
        if v not in ("none", "host"):
            raise ValueError(f'unknown box network {v!r}; set boxes.network = "none" (no network) or "host"')
        return v


class ExecutionSettings(BaseModel):
    """How task children are separated (README "Execution modes"): the uids of linux-dac children, and whether a
    runner sharing the hub's process or uid may offer `process`."""

    uid_base: int = Field(default=300_000, ge=1000)   # principals' children run as uid_base, uid_base + 1, ...
    uid_count: int = Field(default=65_536, ge=1)      # how many principals can hold a uid on this fleet
    allow_process_on_hub: bool = False                # let a runner that shares the hub's process or uid offer process


class RunnerSettings(BaseModel):
    """The in-process runner of `amux up` (a separate `amux runner` takes the same choices as flags)."""

    dedicated: bool = False   # the operator declares this machine dedicated: `process` may be offered
    isolation: list[str] | None = None  # the modes to offer (default: every mode the machine can provide)
    child_network: str = "isolated"     # linux-dac children: "isolated" (the hub and public egress only) or "host"
    egress_allow: list[str] = Field(default_factory=list)  # extra host[:port] an isolated child may reach

    @field_validator("isolation", "egress_allow", mode="before")
    @classmethod
    def _comma_list(cls, v: Any) -> Any:
        return [x.strip() for x in v.split(",") if x.strip()] if isinstance(v, str) else v

    @field_validator("child_network")
    @classmethod
    def _known_network(cls, v: str) -> str:
        if v not in ("isolated", "host"):
            raise ValueError(f'unknown runner.child_network {v!r}; set "isolated" (the hub and public egress only) '
                             f'or "host" (the runner\'s whole network), e.g. AMUX_RUNNER__CHILD_NETWORK=isolated')
        return v


class SchedulesSettings(BaseModel):
    """The durable scheduler (DESIGN §5, §6)."""

    misfire_grace_s: float = 60.0       # a fire later than this is recorded `missed`, not dispatched
    default_timezone: str = "UTC"       # used when a schedule names no timezone
    poll_s: float = 0.5                 # longest sleep of the firing loop between claims
    claim_batch: int = 500              # schedules claimed in one transaction
    firing_workers: int = Field(default=2, ge=1)  # firing loops per replica, claiming apart as replicas do
    reconcile_s: float = 1.0            # reconciler period
    unknown_after_s: float = 120.0      # a firing with no recorded dispatch result becomes `unknown` after this
    min_interval_s: float = Field(default=60.0, ge=0)  # the shortest `every` interval accepted; operators may lower it


class AlertSettings(BaseModel):
    """The alert pipeline's numbers (DESIGN §5); every one overridable as `alerts.*` / `AMUX_ALERTS__*`."""

    aggregation_s: float = 60.0           # failures and missed runs are aggregated this long
    unknown_wait_s: float = 300.0         # an unknown outcome waits this long before alerting
    reminder_interval_s: float = 86400.0  # at most one unacknowledged reminder per this period
    recovery_stable_s: float = 600.0      # recovery closes the card after this many stable seconds
    snooze_s: float = 86400.0             # a snooze lasts this long
    quiet_hours: str = "22:00-08:00"      # local to the schedule's timezone; "" turns them off
    max_new_messages: int = 3             # new status messages per administrator/application ...
    rate_window_s: float = 1800.0         # ... per this window; the excess goes into one digest
    card_update_max_age_s: float = 14 * 86400.0  # Feishu updates a card only this long after sending
    retry_base_s: float = 2.0             # first retry backoff (doubles, capped at retry_max_s)
    retry_max_s: float = 300.0
    lease_s: float = 30.0                 # an outbox claim expires after this (a crashed worker's rows return)
    claim_batch: int = 50                 # notices claimed per worker round
    send_concurrency: int = 16            # concurrent sends of one worker
    poll_s: float = 0.5                   # longest sleep of the alert loop
    catch_up_s: float = 86400.0           # firings reconciled this recently are caught up if never published
    unconfigured_retry_s: float = 60.0    # how often a notice waiting for an administrator is looked at again


class FeishuAppSettings(BaseModel):
    """One Feishu bot application (`[[feishu.apps]]`, DESIGN §4)."""

    app_id: str
    app_secret: str = ""
    encrypt_key: str | None = None
    verification_token: str | None = None
    admin_open_id: str | None = None      # the administrator who receives status notifications
    mode: str = "webhook"                 # or "long-connection"
    base_url: str = "https://open.feishu.cn"
    timezone: str = "Asia/Shanghai"


class FeishuSettings(BaseModel):
    """Feishu applications and delivery numbers."""

    apps: list[FeishuAppSettings] = Field(default_factory=list)
    dedup_window_s: float = 3600.0        # Feishu deduplicates a request uuid for this long
    timeout_s: float = 10.0               # one Open Platform call
    channel: str = "bot.feishu.channel:build_channel"  # the outbox channel the composition root loads
    long_connection_lease_s: float = Field(default=30.0, gt=0)  # a long connection's holder renews every third of it


class OAuthSettings(BaseModel):
    """Dynamic client registration (RFC 7591) for hosted MCP clients (docs/oauth.md)."""

    register_per_minute: int = Field(default=20, ge=0)  # per client address and replica; 0 turns the limit off
    unused_client_ttl_s: float = Field(default=86400.0, gt=0)  # a client with no authorization is pruned after this


class Settings(BaseModel):
    """Everything the hub reads at start."""

    home: Path = Path(".amux")
    database_url: str | None = None
    listen: str = "127.0.0.1:8787"
    secret_key: str | None = None
    public_url: str | None = None
    hub: HubSettings = Field(default_factory=HubSettings)
    leases: LeaseSettings = Field(default_factory=LeaseSettings)
    boxes: BoxSettings = Field(default_factory=BoxSettings)
    profiles: ProfileSettings = Field(default_factory=ProfileSettings)
    memory: MemorySettings = Field(default_factory=MemorySettings)
    schedules: SchedulesSettings = Field(default_factory=SchedulesSettings)
    alerts: AlertSettings = Field(default_factory=AlertSettings)
    feishu: FeishuSettings = Field(default_factory=FeishuSettings)
    oauth: OAuthSettings = Field(default_factory=OAuthSettings)
    execution: ExecutionSettings = Field(default_factory=ExecutionSettings)
    runner: RunnerSettings = Field(default_factory=RunnerSettings)

    def db_url(self) -> str:
        """Return the database URL, defaulting to SQLite in `home`."""
        return self.database_url or f"sqlite+aiosqlite:///{(self.home / 'amux.db').resolve()}"


def _set_path(tree: dict[str, Any], path: list[str], value: str) -> None:
    for part in path[:-1]:
        tree = tree.setdefault(part, {})
    tree[path[-1]] = value


def load_settings(
    config_file: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    **overrides: Any,
) -> Settings:
    """Read the TOML file (if any), overlay `AMUX_*` variables, then explicit overrides."""
    env = os.environ if env is None else env
    home = Path(overrides.get("home") or env.get("AMUX_HOME") or ".amux")
    path = Path(config_file) if config_file else home / "amux.toml"
    data: dict[str, Any] = {}
    if path.exists():
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise Invalid(f"config file {path} is not valid TOML ({e}); fix the line it names") from e
    elif config_file:
        raise Invalid(f"config file {path} does not exist; pass an existing file to --config")
    for key, value in env.items():
        if key.startswith("AMUX_") and key not in ("AMUX_TEST_DATABASE_URL", "AMUX_SESSION_ID", "AMUX_TOKEN",
                                                   "AMUX_HUB_URL"):
            _set_path(data, key[5:].lower().split("__"), value)
    for key, value in overrides.items():
        if value is not None:
            data[key] = value
    try:
        return Settings.model_validate(data)
    except ValidationError as e:
        raise Invalid(f"bad configuration: {e.errors()[0]['loc']}: {e.errors()[0]['msg']}; fix it in {path} or the "
                      "AMUX_* variable") from e
