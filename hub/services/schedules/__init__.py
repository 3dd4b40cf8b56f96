"""Schedules and their firings: definitions (service.py), who may see and control them (access.py), the durable
firing loop and reconciler (firing.py), the seams to Sessions and the alert pipeline (ports.py), where a schedule's
notices go (notices.py), the personal views and results the bot shows (views.py, results.py), and creator recovery
on upgrade (recovery.py).

May import services.tasks (a firing admits a Task), services.auth, services.views, hub/domain and hub/store; Sessions
and the alert pipeline are reached through ports.py, never imported."""
