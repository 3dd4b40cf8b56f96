"""What the bot calls: the hub's services, typed and named — never the store, never the whole hub."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hub.clock import Clock
from hub.config import FeishuSettings
from hub.services.alerts.service import AlertService
from hub.services.auth.service import AuthService
from hub.services.chat.bot import BotService
from hub.services.chat.turns import ChatTurnService
from hub.services.auth.identity import IdentityService
from hub.services.auth.oauth import OAuthService
from hub.services.tasks.dispatch import RunnerDispatch
from hub.services.schedules.results import ScheduleResults
from hub.services.schedules.service import ScheduleService
from hub.services.sessions.service import SessionService
from hub.services.tasks.timeline import TimelineService


@dataclass(frozen=True, kw_only=True)
class BotServices:
    """The collaborators of the Feishu bot, built once by the composition root (hub/app.py)."""

    clock: Clock
    feishu: FeishuSettings
    public_url: str | None
    auth: AuthService
    oauth: OAuthService
    identity: IdentityService
    sessions: SessionService
    schedules: ScheduleService
    results: ScheduleResults       # a schedule's Results view, with the error of an unsuccessful Task
    alerts: AlertService
    runner_dispatch: RunnerDispatch  # the address children are told (`hub_url`), for links when public_url is unset
    state: BotService              # chats' Sessions, long-connection leases, inbound dedup keys
    chats: ChatTurnService         # chat Turns: their progress cards, steering, the answer (all through the outbox)
    directory: Any = None          # Feishu users' display names (bot.feishu.directory), for greetings; None: none
    timeline: TimelineService | None = None  # the Agent Timeline button checks the clicker owns the run
