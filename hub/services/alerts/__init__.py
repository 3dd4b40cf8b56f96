"""The alert center: firing outcomes → incidents → notices (service.py), the persistent outbox and its worker
(outbox.py), and the delivery-channel seam the Feishu channel implements (channel.py).

May import services.schedules (the outcomes it reads, the schedules it names), services.auth, hub/domain and
hub/store; never bot (the composition root wires the Feishu channel in)."""
