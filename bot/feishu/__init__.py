"""The Feishu adapter: tenant tokens, the outbox delivery channel (transport, events and cards arrive with the bot)."""
