"""Card-action and message handlers, one feature per module."""
