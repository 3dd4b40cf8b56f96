"""token kinds: user / admin / runner / run, and the task run a run token belongs to

Revision ID: 0010_token_kinds
Revises: 0001
"""
from alembic import op
import sqlalchemy as sa

revision = "0010_token_kinds"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_tokens") as batch:
        batch.add_column(sa.Column("kind", sa.String(16), nullable=False, server_default="user"))
        batch.add_column(sa.Column("task_id", sa.String(40)))
    op.create_index("ix_api_tokens_task", "api_tokens", ["task_id"])
    # Existing rows: admin tokens become kind admin; the coordination tokens minted for child sessions
    # (`amux-session:<id>`) become run tokens with no run attached (they keep working until revoked).
    op.execute("UPDATE api_tokens SET kind = 'admin' WHERE admin")
    op.execute("UPDATE api_tokens SET kind = 'run' WHERE label LIKE 'amux-session:%'")


def downgrade() -> None:
    op.drop_index("ix_api_tokens_task", table_name="api_tokens")
    with op.batch_alter_table("api_tokens") as batch:
        batch.drop_column("task_id")
        batch.drop_column("kind")
