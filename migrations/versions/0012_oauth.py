"""oauth: the hub as its own OAuth 2.1 authorization server for hosted MCP clients (issue 19 item 4)

Clients registered dynamically (RFC 7591), single-use authorization codes, grants (one per
approval: the refresh-token family), access and refresh tokens, and one-time Feishu login links
with the browser sessions they open. Every secret is stored as its SHA-256 only.

Revision ID: 0012_oauth
Revises: 0001
"""
from alembic import op
import sqlalchemy as sa

revision = "0012_oauth"
down_revision = "0001"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "oauth_clients",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("secret_hash", sa.String(64)),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("redirect_uris", sa.JSON, nullable=False),
        sa.Column("scope", sa.String(200), nullable=False),
        sa.Column("auth_method", sa.String(32), nullable=False),
        sa.Column("info", sa.JSON, nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "oauth_grants",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("client_id", sa.String(64), sa.ForeignKey("oauth_clients.id"), nullable=False),
        sa.Column("principal_id", sa.String(40), sa.ForeignKey("principals.id"), nullable=False),
        sa.Column("scope", sa.String(200), nullable=False),
        sa.Column("resource", sa.Text),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("revoked_at", TS),
        sa.Column("revoked_reason", sa.String(200)),
    )
    op.create_index("ix_oauth_grants_principal", "oauth_grants", ["principal_id"])
    op.create_table(
        "oauth_codes",
        sa.Column("code_hash", sa.String(64), primary_key=True),
        sa.Column("client_id", sa.String(64), sa.ForeignKey("oauth_clients.id"), nullable=False),
        sa.Column("principal_id", sa.String(40), sa.ForeignKey("principals.id"), nullable=False),
        sa.Column("redirect_uri", sa.Text, nullable=False),
        sa.Column("redirect_explicit", sa.Boolean, nullable=False),
        sa.Column("code_challenge", sa.String(128), nullable=False),
        sa.Column("scope", sa.String(200), nullable=False),
        sa.Column("resource", sa.Text),
        sa.Column("expires_at", TS, nullable=False),
        sa.Column("used_at", TS),
        sa.Column("grant_id", sa.String(40)),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "oauth_tokens",
        sa.Column("token_hash", sa.String(64), primary_key=True),
        sa.Column("grant_id", sa.String(40), sa.ForeignKey("oauth_grants.id"), nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("scope", sa.String(200), nullable=False),
        sa.Column("expires_at", TS, nullable=False),
        sa.Column("rotated_at", TS),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index("ix_oauth_tokens_grant", "oauth_tokens", ["grant_id"])
    op.create_table(
        "oauth_logins",
        sa.Column("secret_hash", sa.String(64), primary_key=True),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("principal_id", sa.String(40), sa.ForeignKey("principals.id"), nullable=False),
        sa.Column("expires_at", TS, nullable=False),
        sa.Column("used_at", TS),
        sa.Column("created_at", TS, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("oauth_logins")
    op.drop_table("oauth_tokens")
    op.drop_table("oauth_codes")
    op.drop_index("ix_oauth_grants_principal", "oauth_grants")
    op.drop_table("oauth_grants")
    op.drop_table("oauth_clients")
