"""Credential values never appear in snapshots, results, events, logs or any table after a run."""
from __future__ import annotations

import logging

import sqlalchemy as sa

from hub.services.tasks.service import SubmitRequest
from hub.store.tables import metadata

SECRET = "sk-ant-a9f8e7d6c5b4-never-leak"


async def test_after_a_run_no_table_and_no_log_line_contains_a_credential_value(hub, caplog):
    caplog.set_level(logging.DEBUG)
    await hub.start_runner()
    admin = await hub.hub.auth.authenticate(hub.admin_token)
    await hub.hub.credentials.declare(admin, "anthropic", ["ANTHROPIC_API_KEY"])
    await hub.hub.credentials.set_value(admin, "anthropic", "ANTHROPIC_API_KEY", SECRET)
    script = "env ANTHROPIC_API_KEY\nsay done"
    sub = await hub.hub.tasks.submit(admin,
                                     SubmitRequest(prompt=script, profile="scripted", credential_profile="anthropic"))
    view = await hub.hub.tasks.wait_terminal(admin, sub["task_id"], timeout_s=20)
    assert view["result"]["text"].splitlines()[0] == "[redacted]"  # the engine saw the value; nothing kept it
    rows = []
    async with hub.hub.db.read() as conn:
        for table in metadata.sorted_tables:
            rows += [str(tuple(r)) for r in await conn.execute(sa.select(table))]
    dump = "\n".join(rows)
    assert "anthropic" in dump  # the dump really covers the credential tables
    assert SECRET not in dump
    assert SECRET not in caplog.text
    assert SECRET not in str(view)
