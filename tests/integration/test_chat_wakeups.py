"""The chat driver hears every task's change; only chat Turns' changes may cost it a write transaction."""
from __future__ import annotations

from hub.services.tasks.admission import SubmitRequest


async def test_a_plain_tasks_changes_neither_wake_the_chat_driver_nor_take_the_write_lock(any_hub):
    chats = any_hub.hub.chats
    caller = await any_hub.hub.auth.authenticate(any_hub.admin_token)
    await any_hub.start_runner()
    task_id = (await any_hub.hub.tasks.submit(caller, SubmitRequest(prompt="say hi", profile="scripted")))["task_id"]
    await any_hub.hub.tasks.wait_terminal(caller, task_id, 30)
    chats.kicked.clear()
    any_hub.hub.notifier.notify(f"task:{task_id}")
    assert task_id in chats._hints and not chats.kicked.is_set()  # heard, but no reason to wake the driver at once

    made_due: list = []
    real_due_now = chats.store.due_now

    async def due_now(conn, turn_ids, now):
        made_due.append(list(turn_ids))
        await real_due_now(conn, turn_ids, now)

    chats.store.due_now = due_now  # the hint path's only write
    try:
        await chats.step()  # the poll that picks up what was heard
    finally:
        chats.store.due_now = real_due_now
    assert made_due == [] and task_id not in chats._hints
