"""Dynamic client registration is unauthenticated, so it is bounded: a per-address limit a minute (429 with
Retry-After and an OAuth error), and clients that never completed an authorization are pruned after a day."""
from __future__ import annotations

import asyncio
from datetime import timedelta

import httpx2

from hub.store.db import Database
from hub.store.tokens import SqlOAuthStore
from tests.integration.test_oauth import REDIRECT, signed_in

OTHER = "127.0.0.2"  # a second address: Linux routes all of 127/8 to the loopback interface


async def register(http: httpx2.AsyncClient, url: str) -> httpx2.Response:
    return await http.post(f"{url}/oauth/register", json={"client_name": "Flood", "redirect_uris": [REDIRECT]})


async def test_registration_past_the_per_minute_limit_of_an_address_answers_429_with_retry_after(hub, clock):
    async with httpx2.AsyncClient(timeout=10) as http, httpx2.AsyncClient(
            timeout=10, transport=httpx2.AsyncHTTPTransport(local_address=OTHER)) as other:
        for _ in range(20):  # oauth.register_per_minute
            assert (await register(http, hub.url)).status_code == 201
        clock.advance(30)
        refused = await register(http, hub.url)
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "30"
        body = refused.json()
        assert body["error"] == "temporarily_unavailable"
        assert "oauth.register_per_minute" in body["error_description"] and "retry in 30 s" in body["error_description"]
        assert (await register(other, hub.url)).status_code == 201  # another address has its own count
        clock.advance(30)  # the address's minute is over
        assert (await register(http, hub.url)).status_code == 201


async def test_clients_that_never_completed_an_authorization_are_pruned_after_the_ttl(any_hub, clock):
    url, oauth = any_hub.url, any_hub.hub.oauth
    async with httpx2.AsyncClient(timeout=10) as http:
        unused = (await register(http, url)).json()["client_id"]
        authorized, _ = await signed_in(http, url, await any_hub.token("alice"))
        clock.advance(hours=23)
        recent = (await register(http, url)).json()["client_id"]  # prunes: nothing is a day old yet
        assert await oauth.client(unused) is not None
        clock.advance(hours=2)
        assert (await register(http, url)).status_code == 201  # prunes again: more than a minute later
    assert await oauth.client(unused) is None
    assert await oauth.client(authorized["client_id"]) is not None  # it holds a grant
    assert await oauth.client(recent) is not None  # registered 2 h ago


async def test_replicas_pruning_at_once_delete_each_unused_client_once(any_hub, clock):
    async with httpx2.AsyncClient(timeout=10) as http:
        ids = [(await register(http, any_hub.url)).json()["client_id"] for _ in range(10)]
    replicas = [Database(any_hub.hub.db.url) for _ in range(3)]  # three replicas' pools over the same database
    store = SqlOAuthStore(any_hub.hub.db)

    async def prune(db: Database) -> int:
        async with db.write() as conn:
            return await store.prune_unused_clients(conn, created_before=clock.now() + timedelta(seconds=1),
                                                    limit=100)

    try:
        gone = await asyncio.gather(*(prune(db) for db in replicas))
    finally:
        for db in replicas:
            await db.close()
    assert sum(gone) == len(ids)
    assert all([await any_hub.hub.oauth.client(i) is None for i in ids])


async def test_behind_a_trusted_proxy_the_limit_counts_the_forwarded_client_address(sqlite_url, tmp_path, clock):
    from tests.helpers import start_hub
    hub = await start_hub(sqlite_url, tmp_path, clock, trusted_proxies=["127.0.0.1"])
    try:
        async with httpx2.AsyncClient(timeout=10) as http:
            async def via_proxy(client: str) -> httpx2.Response:
                return await http.post(f"{hub.url}/oauth/register", headers={"X-Forwarded-For": client},
                                       json={"redirect_uris": [REDIRECT]})
            for _ in range(20):
                assert (await via_proxy("198.51.100.7")).status_code == 201
            refused = await via_proxy("6.6.6.6, 198.51.100.7")  # a forged left-most hop changes nothing
            assert refused.status_code == 429 and "198.51.100.7" in refused.json()["error_description"]
            assert (await via_proxy("198.51.100.8")).status_code == 201
    finally:
        await hub.stop()
