"""index firings by task: a task's provenance (`task_get.firing_id`) reads the firing that created it

Revision ID: 0016_firings_task_index
Revises: 0004_schedules
"""
from alembic import op

revision = "0016_firings_task_index"
down_revision = "0004_schedules"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_firings_task_id", "firings", ["task_id"])


def downgrade() -> None:
    op.drop_index("ix_firings_task_id", table_name="firings")
