"""Lease tasks and their boxes (service.py: open, attach, release, close, the reaper) and the Boxes page's sign-in
sessions (box_sessions.py).

May import services.auth, hub/boxes (the box driver interface), hub/domain and hub/store."""
