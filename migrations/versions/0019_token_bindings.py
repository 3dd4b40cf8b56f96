"""token bindings: a runtime name stays with the token that registered it; an OAuth grant dies with the amux token
that approved it

Revision ID: 0019_token_bindings
Revises: 0018_execution_uids
"""
from alembic import op
import sqlalchemy as sa

revision = "0019_token_bindings"
down_revision = "0018_execution_uids"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Existing runtimes have no token yet: the next registration by their owner binds it (RuntimeRegistry._register).
    with op.batch_alter_table("runtimes") as batch:
        batch.add_column(sa.Column("token_id", sa.String(40)))
    # Existing grants were approved by a token nobody recorded: they keep living until revoked or expired.
    with op.batch_alter_table("oauth_codes") as batch:
        batch.add_column(sa.Column("approved_by", sa.String(40)))
    with op.batch_alter_table("oauth_grants") as batch:
        batch.add_column(sa.Column("approved_by", sa.String(40)))
    op.create_index("ix_oauth_grants_approved_by", "oauth_grants", ["approved_by"])


def downgrade() -> None:
    op.drop_index("ix_oauth_grants_approved_by", table_name="oauth_grants")
    with op.batch_alter_table("oauth_grants") as batch:
        batch.drop_column("approved_by")
    with op.batch_alter_table("oauth_codes") as batch:
        batch.drop_column("approved_by")
    with op.batch_alter_table("runtimes") as batch:
        batch.drop_column("token_id")
