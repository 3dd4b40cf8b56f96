"""Services combine domain rules with the store; adapters (hub/web, hub/mcp, bot, the CLI) call these.

One package per aggregate, each owning its rows' rules and transactions; a package imports only the ones below it:

    chat       → sessions, alerts, auth, notify
    alerts     → schedules, auth
    sessions   → tasks, auth, notify, views
    schedules  → tasks, auth, views
    tasks      → auth, notify, views
    leases     → auth
    auth       → (no other service)
    notify, views: shared by the packages above, importing none of them

Every package may import hub/domain, hub/store (its ports and Sql stores), hub/config, hub/clock, hub/errors, hub/ids
and hub/loops; tasks also hub/runner/protocol.py (the messages a runner is sent) and hub/profiles (the builtin
shortcuts), leases hub/boxes (box drivers).
No service imports an adapter (hub/web, hub/mcp, hub/cli, hub/app, bot); SQL stays in hub/store.
"""
