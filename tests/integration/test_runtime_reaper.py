"""A runtime whose runner went away for good (a replaced pod or container) is removed once it has been offline for
`hub.runtime_reap_s` with no work left, and its name is free again; an online one keeps its row however old."""
from __future__ import annotations

from tests.helpers import eventually, start_hub


async def test_a_runtime_offline_past_runtime_reap_s_is_removed_and_an_online_one_is_kept(
        sqlite_url, tmp_path, clock):
    hub = await start_hub(sqlite_url, tmp_path / "home", clock)
    try:
        reap_s = hub.hub.settings.hub.runtime_reap_s
        assert reap_s == 86_400  # the default: a day
        old = await hub.start_runner("pod-old", slots=1)
        await old.stop()

        async def offline() -> bool:
            return any(r["name"] == "pod-old" and r["status"] != "online"
                       for r in await hub.hub.registry.list_runtimes())

        await eventually(offline, timeout=10)
        clock.advance(reap_s - 60)
        await hub.start_runner("pod-new", slots=1)  # online: never removed, however long ago it registered
        await hub.hub.registry.reap_step()
        assert {r["name"] for r in await hub.hub.registry.list_runtimes()} == {"pod-old", "pod-new"}
        clock.advance(120)  # pod-old now offline longer than runtime_reap_s
        await hub.hub.registry.reap_step()
        assert {r["name"] for r in await hub.hub.registry.list_runtimes()} == {"pod-new"}
    finally:
        await hub.stop()
