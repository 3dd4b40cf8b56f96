"""execution uids: the uid each principal's linux-dac task children run under (one per principal, unique)

Revision ID: 0018_execution_uids
Revises: 0017_merge_heads
"""
import sqlalchemy as sa
from alembic import op

revision = "0018_execution_uids"
down_revision = "0017_merge_heads"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "execution_uids",
        sa.Column("principal_id", sa.String(40), sa.ForeignKey("principals.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("uid", sa.Integer, nullable=False, unique=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("execution_uids")
