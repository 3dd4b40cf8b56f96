"""schedule notification preference: notify = failures | all | none, chosen by the creator

Revision ID: 0013_schedule_notify
Revises: 0004_schedules
"""
from alembic import op
import sqlalchemy as sa

revision = "0013_schedule_notify"
down_revision = "0004_schedules"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("schedules") as batch:
        batch.add_column(sa.Column("notify", sa.String(16), nullable=False, server_default="failures"))


def downgrade() -> None:
    with op.batch_alter_table("schedules") as batch:
        batch.drop_column("notify")
