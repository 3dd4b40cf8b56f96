"""Fixtures: both store backends, a real hub, the injected clock."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from hub.clock import ManualClock
from hub.store.db import Database
from tests.helpers import Databases, start_hub


@pytest.fixture(scope="session")
def databases(tmp_path_factory: pytest.TempPathFactory):
    """Migrated templates for the session."""
    dbs = Databases(tmp_path_factory.mktemp("db"))
    yield dbs
    asyncio.run(dbs.drop_template())


@pytest.fixture(params=["sqlite", "postgres"])
async def db_url(request: pytest.FixtureRequest, databases: Databases):
    """A fresh migrated database on each backend."""
    if request.param == "sqlite":
        yield databases.sqlite()
        return
    url = await databases.postgres()
    yield url
    await databases.drop(url)


@pytest.fixture
async def sqlite_url(databases: Databases):
    """A fresh migrated SQLite database (for tests about the HTTP edges, not the store)."""
    yield databases.sqlite()


@pytest.fixture
async def pg_url(databases: Databases):
    """A fresh migrated PostgreSQL database."""
    url = await databases.postgres()
    yield url
    await databases.drop(url)


@pytest.fixture
def clock() -> ManualClock:
    """The injected clock tests advance."""
    return ManualClock()


@pytest.fixture
async def db(db_url: str):
    """A Database on each backend."""
    database = Database(db_url)
    yield database
    await database.close()


@pytest.fixture
async def hub(sqlite_url: str, tmp_path: Path, clock: ManualClock):
    """A hub on a real port over SQLite with the manual clock."""
    handle = await start_hub(sqlite_url, tmp_path, clock)
    yield handle
    await handle.stop()


@pytest.fixture
async def any_hub(db_url: str, tmp_path: Path, clock: ManualClock):
    """A hub on a real port over each backend."""
    handle = await start_hub(db_url, tmp_path, clock)
    yield handle
    await handle.stop()
