"""the upgrade's own time, recorded when this migration runs (creator recovery's cutoff: schedules created later
are never recovered), and a principal's execution access (revoked: its Feishu schedule views show nothing)

Revision ID: 0024_recovery_cutoff
Revises: 0022_manual_firings
"""
from datetime import datetime, timezone

from alembic import op
import sqlalchemy as sa

revision = "0024_recovery_cutoff"
down_revision = "0022_manual_firings"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Expand only: a new table and a nullable column; older replicas neither read nor write them.
    marks = op.create_table(
        "upgrade_marks",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    )
    op.bulk_insert(marks, [{"name": "creator_recovery_cutoff", "at": datetime.now(timezone.utc)}])
    with op.batch_alter_table("principals") as batch:
        batch.add_column(sa.Column("execution_revoked_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    with op.batch_alter_table("principals") as batch:
        batch.drop_column("execution_revoked_at")
    op.drop_table("upgrade_marks")
