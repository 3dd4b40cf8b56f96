"""Engine adapters: each turns a frozen snapshot into a launch and a stream of canonical events.

May import hub/domain and the base modules; the runner hands each launch its sandbox (base.py `Sandbox`)."""
