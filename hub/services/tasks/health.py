"""What `/readyz` and `/metrics` ask of the store: can it answer, and how many tasks and runtimes in each state."""
from __future__ import annotations

from ...store.db import Database
from ...store.registry import SqlRegistryStore
from ...store.tasks import SqlTaskStore


class HealthService:
    """Readiness and gauges of one replica's view of the database."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.tasks = SqlTaskStore(db)
        self.runtimes = SqlRegistryStore(db)

    async def ping(self) -> None:
        """Round-trip the database; raise whatever makes it unreachable."""
        async with self.db.read() as conn:
            await self.tasks.ping(conn)

    async def counts(self) -> dict[str, dict[str, int]]:
        """Tasks and runtimes by status, read in one connection."""
        async with self.db.read() as conn:
            return {"tasks": await self.tasks.count_by_status(conn),
                    "runtimes": await self.runtimes.count_by_status(conn)}
