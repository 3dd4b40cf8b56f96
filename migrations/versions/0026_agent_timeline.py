"""the Agent Timeline: each run's raw agent events (tool input and output, diffs, locations, text), secrets
redacted, swept after `timeline.retention_s`; and the reason a steer was queued instead of delivered

Revision ID: 0026_agent_timeline
Revises: 0024_recovery_cutoff
"""
from alembic import op
import sqlalchemy as sa

revision = "0026_agent_timeline"
down_revision = "0024_recovery_cutoff"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Expand only: a new table and a nullable column; older replicas neither read nor write them.
    op.create_table(
        "timeline_events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(40), nullable=False),
        sa.Column("rseq", sa.Integer, nullable=False),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("payload", sa.JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("run_id", "rseq", name="uq_timeline_events_run_rseq"),
    )
    op.create_index("ix_timeline_events_created", "timeline_events", ["created_at"])
    with op.batch_alter_table("mailbox") as batch:
        batch.add_column(sa.Column("note", sa.String(1000)))


def downgrade() -> None:
    with op.batch_alter_table("mailbox") as batch:
        batch.drop_column("note")
    op.drop_index("ix_timeline_events_created", table_name="timeline_events")
    op.drop_table("timeline_events")
