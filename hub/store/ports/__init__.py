"""The interfaces of the stores, one module per service package (tasks, schedules, sessions, leases), over the
records they return (hub/store/records.py, and the records defined beside a store: hub/store/leases.py,
questions.py).

Services hold a store through these Protocols (`TaskService.store: TaskStore`), so what a service may ask of the
store, and what shape it gets back, is written in one place; `SqlTaskStore`, `SqlScheduleStore`, `SqlLeaseStore`,
`SqlMemoryStore`, `SqlQuestionStore`, `SqlInstanceStore` and `SqlSessionStore` implement them on SQLite and
PostgreSQL (mypy checks that they do). May import the store's own modules and hub/domain; nothing above the store.
"""
