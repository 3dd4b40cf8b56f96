"""`/metrics` is not public: the metrics token when one is set, else an admin token; `hub.metrics_listen` serves it
alone on an address of its own, open there unless the token is set."""
from __future__ import annotations

import httpx2

from tests.helpers import start_hub


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_metrics_without_a_metrics_token_answers_only_an_admin_token(hub):
    user = await hub.token("alice")
    async with httpx2.AsyncClient(timeout=10) as http:
        anonymous = await http.get(f"{hub.url}/metrics")
        assert anonymous.status_code == 401 and anonymous.headers["WWW-Authenticate"].startswith("Bearer")
        body = anonymous.json()
        assert body["error"] == "unauthorized" and "admin token" in body["fix"] and body["request_id"]
        assert "hub.metrics_token" in body["fix"]
        refused = await http.get(f"{hub.url}/metrics", headers=bearer(user))
        assert refused.status_code == 403 and "admin token" in refused.json()["fix"]
        ok = await http.get(f"{hub.url}/metrics", headers=bearer(hub.admin_token))
        assert ok.status_code == 200 and "amux_tasks{" in ok.text
        assert (await http.get(f"{hub.url}/healthz")).status_code == 200  # probes stay open
        assert (await http.get(f"{hub.url}/readyz")).status_code == 200


async def test_metrics_with_a_metrics_token_answers_that_token_only(sqlite_url, tmp_path, clock):
    hub = await start_hub(sqlite_url, tmp_path, clock, metrics_token="scrape-secret")
    try:
        async with httpx2.AsyncClient(timeout=10) as http:
            assert (await http.get(f"{hub.url}/metrics", headers=bearer("scrape-secret"))).status_code == 200
            for headers in ({}, bearer("wrong"), bearer(hub.admin_token)):
                resp = await http.get(f"{hub.url}/metrics", headers=headers)
                assert resp.status_code == 401 and "hub.metrics_token" in resp.json()["fix"]
    finally:
        await hub.stop()


async def test_metrics_listen_serves_metrics_alone_on_its_own_address(sqlite_url, tmp_path, clock):
    hub = await start_hub(sqlite_url, tmp_path, clock, metrics_listen="127.0.0.1:0")
    try:
        url = hub.hub.metrics_url
        assert url and url.endswith("/metrics") and not url.startswith(hub.url)
        async with httpx2.AsyncClient(timeout=10) as http:
            scraped = await http.get(url)  # the address is the protection: no token asked
            assert scraped.status_code == 200 and "amux_loop_up{" in scraped.text
            assert (await http.get(url.replace("/metrics", "/api/v1/tasks"))).status_code == 404
            assert (await http.get(f"{hub.url}/metrics")).status_code == 401  # the main address still asks
    finally:
        await hub.stop()
    hub = await start_hub(sqlite_url, tmp_path, clock, metrics_listen="127.0.0.1:0", metrics_token="s")
    try:
        async with httpx2.AsyncClient(timeout=10) as http:
            assert (await http.get(hub.hub.metrics_url)).status_code == 401
            assert (await http.get(hub.hub.metrics_url, headers=bearer("s"))).status_code == 200
    finally:
        await hub.stop()
