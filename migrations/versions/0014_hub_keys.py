"""hub keys: random secrets the replicas share through the database (e.g. the MCP client-session signer)

Revision ID: 0014_hub_keys
Revises: 0001
"""
from alembic import op
import sqlalchemy as sa

revision = "0014_hub_keys"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "hub_keys",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("secret", sa.String(128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("hub_keys")
