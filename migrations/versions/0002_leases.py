"""leases: lease tasks (seed: Rift tasks) and the boxes claimed inside them

Revision ID: 0002_leases
Revises: 0001
"""
from alembic import op
import sqlalchemy as sa

revision = "0002_leases"
down_revision = "0001"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "lease_tasks",
        sa.Column("id", sa.String(48), primary_key=True),
        sa.Column("owner_id", sa.String(40), sa.ForeignKey("principals.id"), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("holder_label", sa.String(200)),
        sa.Column("holder_token_id", sa.String(40)),
        sa.Column("secret_hash", sa.String(64)),
        sa.Column("attached_at", TS),
        sa.Column("last_activity_at", TS, nullable=False),
        sa.Column("released_at", TS),
        sa.Column("closed_at", TS),
        sa.Column("closed_reason", sa.String(200)),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index("ix_lease_tasks_owner_status", "lease_tasks", ["owner_id", "status"])
    op.create_index("ix_lease_tasks_status_activity", "lease_tasks", ["status", "last_activity_at"])
    op.create_table(
        "boxes",
        sa.Column("id", sa.String(48), primary_key=True),
        sa.Column("task_id", sa.String(48), sa.ForeignKey("lease_tasks.id"), nullable=False),
        sa.Column("name", sa.String(200)),
        sa.Column("driver", sa.String(32), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("handle", sa.JSON),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("destroyed_at", TS),
    )
    op.create_index("ix_boxes_task_state", "boxes", ["task_id", "state"])
    op.create_index("ix_boxes_state", "boxes", ["state"])


def downgrade() -> None:
    op.drop_table("boxes")
    op.drop_table("lease_tasks")
