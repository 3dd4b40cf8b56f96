"""sessions and turns, agent instances and their mailbox, memory

Turns and instance runs execute through the same ledger as Tasks (task_runs), told apart by `kind`;
only kind 'task' rows are TaskRuns and appear in Task history.

Revision ID: 0005_sessions
Revises: 0001
"""
from alembic import op
import sqlalchemy as sa

revision = "0005_sessions"
down_revision = "0001"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("task_runs") as batch:
        batch.add_column(sa.Column("kind", sa.String(16), nullable=False, server_default="task"))
        batch.add_column(sa.Column("session_id", sa.String(40)))
        batch.add_column(sa.Column("turn_seq", sa.Integer))
        batch.add_column(sa.Column("resume_handle", sa.String(400)))
    op.create_index("ix_task_runs_session", "task_runs", ["session_id", "turn_seq"])
    op.create_index("ix_task_runs_instance", "task_runs", ["instance_id", "created_at"])
    op.create_table(
        "sessions",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("name", sa.String(200)),
        sa.Column("owner_id", sa.String(40), sa.ForeignKey("principals.id"), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),  # interactive | child
        sa.Column("source", sa.String(32), nullable=False),  # cli | feishu | instance | mcp
        sa.Column("engine", sa.String(32), nullable=False),
        sa.Column("model", sa.String(200)),
        sa.Column("reasoning_effort", sa.String(16)),
        sa.Column("snapshot", sa.JSON, nullable=False),
        sa.Column("runtime_id", sa.String(40)),
        sa.Column("resume_handle", sa.String(400)),
        sa.Column("parent_session_id", sa.String(40)),
        sa.Column("turns", sa.Integer, nullable=False),
        sa.Column("memory_scope", sa.String(200)),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )
    op.create_index("ix_sessions_owner_name", "sessions", ["owner_id", "name"])
    op.create_table(
        "instances",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("owner_id", sa.String(40), sa.ForeignKey("principals.id"), nullable=False),
        sa.Column("name", sa.String(200)),
        sa.Column("session_id", sa.String(40), nullable=False),
        sa.Column("snapshot", sa.JSON, nullable=False),
        sa.Column("archived_at", TS),
        sa.Column("current_task_id", sa.String(40)),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )
    op.create_table(
        "mailbox",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("instance_id", sa.String(40), sa.ForeignKey("instances.id"), nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),  # queued | steer
        sa.Column("state", sa.String(16), nullable=False),  # queued | delivered | pending | refused | unknown
        sa.Column("task_id", sa.String(40)),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("sent_at", TS),
        sa.Column("settled_at", TS),
    )
    op.create_index("ix_mailbox_instance_state", "mailbox", ["instance_id", "state"])
    op.create_table(
        "memory",
        sa.Column("scope", sa.String(200), primary_key=True),
        sa.Column("key", sa.String(200), primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )


def downgrade() -> None:
    for name in ("memory", "mailbox", "instances", "sessions"):
        op.drop_table(name)
    op.drop_index("ix_task_runs_instance", "task_runs")
    op.drop_index("ix_task_runs_session", "task_runs")
    with op.batch_alter_table("task_runs") as batch:
        for col in ("resume_handle", "turn_seq", "session_id", "kind"):
            batch.drop_column(col)
