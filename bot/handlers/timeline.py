"""The Agent Timeline button (bot/cards/timeline.py): send the clicker a private one-time sign-in link to the page.

Only someone the timeline shows the run to gets a link (its owner, hub admins, and the administrator of a Feishu
application whose alert center shows it: `TimelineService.read`); anyone else — another user pressing a button in
a shared chat — gets the same refusal as for a run that does not exist, and nothing is sent. The link is
`/amux login`'s (one use, ten minutes) with a `next` that lands on the run's timeline page.
"""
from __future__ import annotations

from bot.cards.actions import Timeline
from bot.cards.timeline import render_timeline_link
from bot.i18n import _
from hub.domain.timeline import page_path
from hub.errors import NotFound

from .context import Answer, Ctx, handles

NOT_YOURS = _("That Agent Timeline is not yours (or no longer exists); nothing was sent.")


@handles(Timeline)
async def open_timeline(ctx: Ctx, a: Timeline) -> Answer:
    """Check the timeline shows the run to the clicker, then send them a private sign-in link that lands on it."""
    services, v = ctx.services, ctx.viewer
    if services.timeline is None or not a.run_id:
        return Answer(toast=NOT_YOURS, toast_kind="error")
    try:
        await services.timeline.read(v.caller(), "turn" if a.run_kind == "turn" else "task", a.run_id, limit=1)
    except NotFound:
        return Answer(toast=NOT_YOURS, toast_kind="error")
    base = services.public_url or services.runner_dispatch.hub_url
    link = await services.oauth.issue_login_link(v.principal_id, base, page_path(a.run_kind, a.run_id))
    return Answer(toast=_("A one-time sign-in link to the Agent Timeline was sent to you in a private message."),
                  toast_kind="success", private=("interactive", render_timeline_link(ctx.tr, a.run_kind, a.run_id,
                                                                                      link)))
