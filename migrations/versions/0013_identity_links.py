"""identity links: one-time codes that bind a Feishu identity to an existing principal (`amux identity link`)

Revision ID: 0013_identity_links
Revises: 0001
"""
from alembic import op
import sqlalchemy as sa

revision = "0013_identity_links"
down_revision = "0001"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "identity_link_codes",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("principal_id", sa.String(40), sa.ForeignKey("principals.id"), nullable=False),
        sa.Column("code_hash", sa.String(64), nullable=False),   # sha256 of the normalized code; the code is shown once
        sa.Column("created_at", TS, nullable=False),
        sa.Column("expires_at", TS, nullable=False),
        sa.Column("used_at", TS),
        sa.Column("binding_id", sa.String(40)),                   # the binding it made (or moved), once used
        sa.UniqueConstraint("code_hash", name="uq_identity_link_codes_hash"),
    )
    op.create_index("ix_identity_link_codes_principal", "identity_link_codes", ["principal_id"])


def downgrade() -> None:
    op.drop_index("ix_identity_link_codes_principal", table_name="identity_link_codes")
    op.drop_table("identity_link_codes")
