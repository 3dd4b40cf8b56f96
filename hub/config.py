"""Settings: an optional TOML file overlaid by `AMUX_*` environment variables (`__` between levels), then explicit
overrides (the CLI's flags); `load_settings` (hub/config_sources.py) loads them with pydantic-settings, every key
checked."""
from __future__ import annotations

import contextvars
import ipaddress
import json
import logging
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from .domain.limits import Limits, default_cpus, parse_size
from .errors import Invalid


# The sources of the load in progress after the arguments (hub/config_sources.py sets them); outside a load, none.
SOURCES: contextvars.ContextVar[tuple[Any, ...]] = contextvars.ContextVar("amux_settings_sources", default=())


class Section(BaseModel):
    """A settings table: an unknown key is an error, never silently ignored."""

    model_config = ConfigDict(extra="forbid")


def _comma_or_json_list(v: Any) -> Any:
    """Read a list given as a comma-separated string (the environment's form) or a JSON array."""
    if isinstance(v, str):
        if v.lstrip().startswith("["):
            return json.loads(v)
        return [x.strip() for x in v.split(",") if x.strip()]
    return v


class HubSettings(Section):
    """Dispatch and runner timing."""

    reservation_ttl_s: float = 30.0
    runtime_lost_s: float = 60.0
    # A runtime offline this long with no work left is removed and its name freed (a replaced runner pod or
    # container registers anew under its own name); 0 = never.
    runtime_reap_s: float = Field(default=86_400.0, ge=0)
    heartbeat_s: float = 5.0
    deadline_grace_s: float = 30.0
    poll_s: float = 0.25
    max_prompt_bytes: int = 256 * 1024
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
    trusted_proxies: Annotated[list[str], NoDecode] = Field(default_factory=list)

    @field_validator("trusted_proxies", mode="before")
    @classmethod
    def _proxy_list(cls, v: Any) -> Any:
        items = _comma_or_json_list(v)
        for item in items or []:
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"hub.trusted_proxies: {item!r} is not an IP address or network; write e.g. "
                                 '"10.0.0.0/8" or "192.0.2.7"') from None
        return items


class PresetSettings(Section):
    """A builtin launch preset (runtime, model, reasoning effort); omitted fields stay engine defaults."""

    runtime: str | None = None
    model: str | None = None
    reasoning_effort: str | None = None


class ProfileSettings(Section):
    """Profile defaults of this distribution."""

    default_profile: str = "scripted"   # used when a task names no profile
    default_preset: str = "claude"      # the distribution's default builtin launch preset
    presets: dict[str, PresetSettings] = Field(default_factory=dict)
    authoring_runtime: str | None = None  # explicitly configured runtime for local expert authoring


class MemorySettings(Section):
    """Hub memory scopes."""

    # On (the default): each principal's executions use that principal's own memory. Off: every principal shares one
    # global memory, an operator's explicit choice (README "Memory").
    user_isolation: bool = True


class LeaseSettings(Section):
    """Task-lease clocks (seed: rift tasks)."""

    activity_granularity_s: float = 60
    takeover_quiet_s: float = 1800
    auto_close_quiet_s: float = 14400
    # Open lease tasks one principal may hold at once (README "Boxes"); 0 = no limit; admin tokens are exempt.
    max_open_tasks_per_principal: int = Field(default=20, ge=0)


class BoxSettings(Section):
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


class ExecutionSettings(Section):
    """How task children are separated (README "Execution modes"): the uids of linux-dac children, and whether a
    runner sharing the hub's process or uid may offer `process`."""

    uid_base: int = Field(default=300_000, ge=1000)   # principals' children run as uid_base, uid_base + 1, ...
    uid_count: int = Field(default=65_536, ge=1)      # how many principals can hold a uid on this fleet
    allow_process_on_hub: bool = False                # let a runner that shares the hub's process or uid offer process


class RunnerSettings(Section):
    """The in-process runner of `amux up` (a separate `amux runner` takes the same choices as flags)."""

    dedicated: bool = False   # the operator declares this machine dedicated: `process` may be offered
    isolation: Annotated[list[str] | None, NoDecode] = None  # the modes to offer (default: every mode possible here)
    child_network: str = "isolated"     # linux-dac children: "isolated" (the hub and public egress only) or "host"
    # extra host[:port] an isolated child may reach
    egress_allow: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # a run whose engine says nothing this long gets a status event, and a timeout names the stall; 0 = off
    stall_notice_s: float = Field(default=300.0, ge=0)
    # each task child's ceilings (README "Resource limits"); a profile or a request may only lower them
    memory_max: str = "4GiB"            # bytes with a unit: 4GiB, 512MiB
    pids_max: int = Field(default=1024, ge=1, le=4_194_304)   # processes and threads
    cpu_max: float | None = Field(default=None, ge=0.01, le=4096)   # cores; default: the machine's less one
    cgroup_parent: str | None = None    # a cgroup delegated to a runner that is not root (see the README)

    @field_validator("isolation", "egress_allow", mode="before")
    @classmethod
    def _comma_list(cls, v: Any) -> Any:
        return _comma_or_json_list(v)

    @field_validator("memory_max")
    @classmethod
    def _size(cls, v: str) -> str:
        try:
            parse_size(v, "runner.memory_max")
        except Invalid as e:
            raise ValueError(f"{e.message}, e.g. AMUX_RUNNER__MEMORY_MAX=4GiB") from None
        return v

    def limits(self) -> Limits:
        """The runner's limits from these settings (the machine's cores less one where cpu_max is unset)."""
        return Limits(parse_size(self.memory_max), self.pids_max, self.cpu_max or default_cpus())

    @field_validator("child_network")
    @classmethod
    def _known_network(cls, v: str) -> str:
        if v not in ("isolated", "host"):
            raise ValueError(f'unknown runner.child_network {v!r}; set "isolated" (the hub and public egress only) '
                             f'or "host" (the runner\'s whole network), e.g. AMUX_RUNNER__CHILD_NETWORK=isolated')
        return v


class SchedulesSettings(Section):
    """The durable scheduler (DESIGN §5, §6)."""

    misfire_grace_s: float = 60.0       # a fire later than this is recorded `missed`, not dispatched
    default_timezone: str = "UTC"       # used when a schedule names no timezone
    poll_s: float = 0.5                 # longest sleep of the firing loop between claims
    claim_batch: int = 500              # schedules claimed in one transaction
    firing_workers: int = Field(default=2, ge=1)  # firing loops per replica, claiming apart as replicas do
    reconcile_s: float = 1.0            # reconciler period
    unknown_after_s: float = 120.0      # a firing with no recorded dispatch result becomes `unknown` after this
    min_interval_s: float = Field(default=60.0, ge=0)  # the shortest `every` interval accepted; operators may lower it


class AlertSettings(Section):
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


class FeishuAppSettings(Section):
    """One Feishu bot application (`[[feishu.apps]]`, DESIGN §4)."""

    app_id: str
    app_secret: str = ""
    encrypt_key: str | None = None
    verification_token: str | None = None
    admin_open_id: str | None = None      # the administrator who receives status notifications
    mode: str = "webhook"                 # or "long-connection"
    base_url: str = "https://open.feishu.cn"
    timezone: str = "Asia/Shanghai"
    profile: str | None = None            # the profile of this application's chats (None: the hub's default)


class FeishuSettings(Section):
    """Feishu applications and delivery numbers."""

    # `[[feishu.apps]]` in TOML; from the environment AMUX_FEISHU__APPS='[{"app_id": …}]' (a JSON array), or
    # AMUX_FEISHU__APPS_FILE naming a TOML (`[[apps]]`) or JSON file (an array, or {"apps": […]}): one or the other.
    apps: list[FeishuAppSettings] = Field(default_factory=list)
    apps_file: Path | None = None
    dedup_window_s: float = 3600.0        # Feishu deduplicates a request uuid for this long
    timeout_s: float = 10.0               # one Open Platform call
    channel: str = "bot.feishu.channel:build_channel"  # the outbox channel the composition root loads
    long_connection_lease_s: float = Field(default=30.0, gt=0)  # a long connection's holder renews every third of it
    chat_update_s: float = Field(default=2.0, ge=0.2)  # a progress card's fastest update pace (5 PATCH/s per message)
    chat_steer_wait_s: float = Field(default=5.0, gt=0)  # a steer not settled by its runner this long is unknown

    @model_validator(mode="after")
    def _apps_from_file(self) -> FeishuSettings:
        if self.apps_file is None:
            return self
        if self.apps:
            raise ValueError("feishu.apps and feishu.apps_file are both set; keep one (AMUX_FEISHU__APPS or "
                             "AMUX_FEISHU__APPS_FILE)")
        self.apps = [FeishuAppSettings.model_validate(a) for a in read_apps_file(self.apps_file)]
        return self


def read_apps_file(path: Path) -> list[Any]:
    """Return the app tables of a Feishu apps file: JSON (an array or {"apps": [...]}) or TOML (`[[apps]]`)."""
    try:
        text = path.read_text()
    except OSError as e:
        raise ValueError(f"feishu.apps_file {path}: {e.strerror or e}; point it at a readable file") from None
    try:
        data: Any = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except ValueError as e:
        raise ValueError(f"feishu.apps_file {path} is not valid {'JSON' if path.suffix == '.json' else 'TOML'} "
                         f"({e}); fix the line it names") from None
    if isinstance(data, dict):
        data = data.get("feishu", data).get("apps", [])
    if not isinstance(data, list):
        raise ValueError(f"feishu.apps_file {path} holds no list of apps; write [[apps]] tables (TOML) or a JSON "
                         "array of app objects")
    return data


class LogSettings(Section):
    """Logs (README "Configuration"): text or JSON lines on stderr, and one access line per HTTP request."""

    format: Literal["text", "json"] = "text"
    level: str = "WARNING"     # the hub's own loggers; AMUX_LOG_LEVEL is the older spelling of AMUX_LOG__LEVEL
    access: bool = True        # access lines (logger amux.access, INFO) whatever `level` says

    @field_validator("level", mode="before")
    @classmethod
    def _known_level(cls, v: Any) -> Any:
        name = str(v).strip().upper()
        if name not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ValueError(f"unknown log level {v!r}; set log.level to DEBUG, INFO, WARNING, ERROR or CRITICAL, "
                             "e.g. AMUX_LOG__LEVEL=INFO")
        return name

    def level_number(self) -> int:
        """Return the level as `logging` numbers it."""
        return logging.getLevelNamesMapping()[self.level]


class OAuthSettings(Section):
    """Dynamic client registration (RFC 7591) for hosted MCP clients (docs/oauth.md)."""

    register_per_minute: int = Field(default=20, ge=0)  # per client address and replica; 0 turns the limit off
    unused_client_ttl_s: float = Field(default=86400.0, gt=0)  # a client with no authorization is pruned after this


class TimelineSettings(Section):
    """The Agent Timeline (docs/timeline.md): raw agent events per run, kept this long."""

    retention_s: float = Field(default=14 * 86400.0, gt=0)  # an event older than this is swept
    sweep_s: float = Field(default=300.0, gt=0)  # how often a replica sweeps
    sweep_batch: int = Field(default=5000, ge=1)  # events deleted per statement


class Settings(BaseSettings):
    """Everything the hub reads at start; `load_settings` (hub/config_sources.py) says from where."""

    model_config = SettingsConfigDict(env_prefix="AMUX_", env_nested_delimiter="__", case_sensitive=False,
                                      extra="forbid", nested_model_default_partial_update=False)

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
    log: LogSettings = Field(default_factory=LogSettings)
    timeline: TimelineSettings = Field(default_factory=TimelineSettings)

    def db_url(self) -> str:
        """Return the database URL, defaulting to SQLite in `home`."""
        return self.database_url or f"sqlite+aiosqlite:///{(self.home / 'amux.db').resolve()}"

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: Any, env_settings: Any,
                                   dotenv_settings: Any, file_secret_settings: Any) -> tuple[Any, ...]:
        """Read what `load_settings` chose (flags, then the environment, then the TOML file); no .env files."""
        return (init_settings, *SOURCES.get())

