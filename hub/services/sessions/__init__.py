"""Interactive Sessions and their Turns (service.py), persistent Agent Instances with their mailbox (instances.py),
and hub memory by scope (memory.py).

May import services.tasks (Turns and instance runs are runs of the ledger), services.auth, services.notify,
services.views, hub/domain and hub/store."""
