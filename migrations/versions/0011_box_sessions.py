"""box sessions: the Boxes page's sign-in sessions (issue 13 item 8)

The `amux_boxes` cookie holds `<session id>.<secret>`, never an API token; only the secret's SHA-256 is
stored. A session ends at `expires_at`, when revoked, or when the API token that opened it is revoked.

Revision ID: 0011_box_sessions
Revises: 0001
"""
from alembic import op
import sqlalchemy as sa

revision = "0011_box_sessions"
down_revision = "0001"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "box_sessions",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("principal_id", sa.String(40), sa.ForeignKey("principals.id"), nullable=False),
        sa.Column("token_id", sa.String(40), nullable=False),
        sa.Column("session_hash", sa.String(64), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("expires_at", TS, nullable=False),
        sa.Column("revoked_at", TS),
        sa.UniqueConstraint("session_hash", name="uq_box_sessions_hash"),
    )
    op.create_index("ix_box_sessions_principal", "box_sessions", ["principal_id"])


def downgrade() -> None:
    op.drop_table("box_sessions")
