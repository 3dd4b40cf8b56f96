"""Delivery across an administrator change: sent receipts are never replayed, undelivered ones are re-addressed."""
from __future__ import annotations

from datetime import timedelta

from tests.fakes.feishu import card_text
from tests.integration.test_alerts_feishu import ADMIN, fake, make_env  # noqa: F401 — fixture


async def test_completed_receipts_are_not_replayed_after_an_administrator_change(db_url, tmp_path, clock, fake):
    e = await make_env(db_url, tmp_path, clock, fake, quiet_hours="")
    at = (clock.now() + timedelta(minutes=5)).isoformat()
    await e.setup(rule=f"at {at}", name="release")
    await e.fire("succeeded")
    await e.round()
    assert [m.receive_id for m in fake.sent] == [ADMIN] and "finished: release" in card_text(fake.sent[0].content)
    e.hub.settings.feishu.apps[0].admin_open_id = "ou_new"
    await e.hub.alerts.sync_apps()
    await e.round(3600)
    await e.round(86400)
    assert fake.sent_to("ou_new") == [] and len(fake.sent) == 1     # delivered once, to the administrator of then
    await e.hub.db.close()


async def test_an_undelivered_receipt_goes_to_the_new_administrator_once(db_url, tmp_path, clock, fake):
    e = await make_env(db_url, tmp_path, clock, fake, quiet_hours="")
    at = (clock.now() + timedelta(minutes=5)).isoformat()
    await e.setup(rule=f"at {at}", name="release")
    fake.fail("5xx", times=100, op="send")                           # stuck retrying to the old administrator
    await e.fire("succeeded")
    await e.round()
    fake.clear_faults()
    e.hub.settings.feishu.apps[0].admin_open_id = "ou_new"
    await e.hub.alerts.sync_apps()
    await e.round(60)
    await e.round(3600)
    assert len(fake.sent_to("ou_new")) == 1 and fake.sent_to(ADMIN) == []
    await e.hub.db.close()
