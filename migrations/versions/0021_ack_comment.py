"""incident acknowledgement comment: what the administrator said when acknowledging (who and when already exist)

Revision ID: 0021_ack_comment
Revises: 0020_schedule_overlap
"""
from alembic import op
import sqlalchemy as sa

revision = "0021_ack_comment"
down_revision = "0020_schedule_overlap"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Expand only: a nullable column; older replicas neither read nor write it.
    with op.batch_alter_table("incidents") as batch:
        batch.add_column(sa.Column("ack_comment", sa.String(1000)))


def downgrade() -> None:
    with op.batch_alter_table("incidents") as batch:
        batch.drop_column("ack_comment")
