"""The runner: the process that connects a machine to the hub and launches engines (agent.py), the messages hub and
runner exchange (protocol.py, which the hub's services send), and a task child's boundary, limits and egress
(boundary.py, confine.py, egress.py, childinit.py).

May import hub/engines, hub/boxes, hub/domain and the base modules; never the services, the store or an adapter."""
