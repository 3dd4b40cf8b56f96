"""Feishu adapter for the amux hub (cards, events, delivery channel)."""
