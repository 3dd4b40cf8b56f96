"""The Feishu chat flow on the hub's side: a chat message's Turn with its live progress card and answer (turns.py),
and what the bot keeps in the database: each chat's Session, long-connection leases, inbound dedup keys (bot.py).

May import services.sessions, services.alerts (its cards go out through the outbox), services.auth,
services.notify, hub/domain and hub/store; the cards themselves are rendered by bot/ through a port."""
