"""schedule overlap policy: overlap = allow | skip | replace, what a fire does while the previous Task is unfinished

Revision ID: 0020_schedule_overlap
Revises: 0019_token_bindings
"""
from alembic import op
import sqlalchemy as sa

revision = "0020_schedule_overlap"
down_revision = "0019_token_bindings"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Existing schedules keep today's behaviour: every fire admits its Task (allow).
    with op.batch_alter_table("schedules") as batch:
        batch.add_column(sa.Column("overlap", sa.String(16), nullable=False, server_default="allow"))


def downgrade() -> None:
    with op.batch_alter_table("schedules") as batch:
        batch.drop_column("overlap")
