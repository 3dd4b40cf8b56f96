"""The execution ledger: every run (a Task, a Session's Turn, an instance's run) from admission to its outcome.

Admission freezes the snapshot (admission.py, with profiles.py and delegation.py); service.py admits, reads, waits and
cancels Tasks; dispatch.py places runs on runtimes and reaps them; registry.py registers runtimes; reports.py applies
what runners report (questions.py: a run asking its person); timeline.py reads the Agent Timeline; health.py the
counts `/readyz` and `/metrics` show.

May import services.auth, services.notify, services.views, hub/runner/protocol.py, hub/profiles, hub/domain, hub/store
and the base modules (config, clock, loops, …)."""
