"""foundation: principals, tokens, runtimes, task runs, reservations, events

Revision ID: 0001
Revises:
"""
from alembic import op
import sqlalchemy as sa

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "principals",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("principal_id", sa.String(40), sa.ForeignKey("principals.id"), nullable=False, index=True),
        sa.Column("label", sa.String(200)),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("admin", sa.Boolean, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("last_used_at", TS),
        sa.Column("revoked_at", TS),
    )
    op.create_table(
        "runtimes",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("principal_id", sa.String(40), sa.ForeignKey("principals.id"), nullable=False),
        sa.Column("shared", sa.Boolean, nullable=False),
        sa.Column("capabilities", sa.JSON, nullable=False),
        sa.Column("slots", sa.Integer, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("connection_id", sa.String(40)),
        sa.Column("registered_at", TS, nullable=False),
        sa.Column("last_seen_at", TS, nullable=False),
    )
    op.create_table(
        "task_runs",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("owner_id", sa.String(40), sa.ForeignKey("principals.id"), nullable=False),
        sa.Column("name", sa.String(200)),
        sa.Column("prompt", sa.Text, nullable=False),
        sa.Column("snapshot", sa.JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("outcome", sa.String(16)),
        sa.Column("error", sa.Text),
        sa.Column("result_text", sa.Text),
        sa.Column("result_json", sa.JSON),
        sa.Column("usage_json", sa.JSON),
        sa.Column("changed_files", sa.JSON),
        sa.Column("runtime_id", sa.String(40), index=True),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("event_seq", sa.Integer, nullable=False),
        sa.Column("last_rseq", sa.Integer, nullable=False),
        sa.Column("cancel_requested_at", TS),
        sa.Column("deadline_at", TS),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("dispatched_at", TS),
        sa.Column("started_at", TS),
        sa.Column("finished_at", TS),
        sa.Column("parent_session_id", sa.String(40)),
        sa.Column("parent_turn_id", sa.String(40)),
        sa.Column("instance_id", sa.String(40)),
    )
    op.create_index("ix_task_runs_owner_created", "task_runs", ["owner_id", "created_at"])
    op.create_index("ix_task_runs_status_created", "task_runs", ["status", "created_at"])
    op.create_table(
        "reservations",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("runtime_id", sa.String(40), sa.ForeignKey("runtimes.id"), nullable=False),
        sa.Column("task_id", sa.String(40), sa.ForeignKey("task_runs.id"), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("expires_at", TS, nullable=False),
        sa.Column("sent_at", TS),
        sa.Column("released_at", TS),
    )
    op.create_index("ix_reservations_state_runtime", "reservations", ["state", "runtime_id"])
    op.create_index("ix_reservations_task", "reservations", ["task_id"])
    op.create_table(
        "task_events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("task_id", sa.String(40), sa.ForeignKey("task_runs.id"), nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("payload", sa.JSON, nullable=False),
        sa.Column("turn_id", sa.String(40)),
        sa.Column("created_at", TS, nullable=False),
        sa.UniqueConstraint("task_id", "seq", name="uq_task_events_task_seq"),
    )


def downgrade() -> None:
    for name in ("task_events", "reservations", "task_runs", "runtimes", "api_tokens", "principals"):
        op.drop_table(name)
