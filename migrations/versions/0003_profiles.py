"""profiles (manifest v2), credential profiles and encrypted values, permission replies

Revision ID: 0003_profiles
Revises: 0001
"""
from alembic import op
import sqlalchemy as sa

revision = "0003_profiles"
down_revision = "0001"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "profiles",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("engine", sa.String(32), nullable=False),
        sa.Column("manifest", sa.JSON, nullable=False),
        sa.Column("digest", sa.String(80), nullable=False),
        sa.Column("created_by", sa.String(40), sa.ForeignKey("principals.id"), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )
    op.create_table(
        "credential_profiles",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("env_names", sa.JSON, nullable=False),
        sa.Column("created_by", sa.String(40), sa.ForeignKey("principals.id"), nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "credential_values",
        sa.Column("profile_name", sa.String(64), sa.ForeignKey("credential_profiles.name"), primary_key=True),
        sa.Column("principal_id", sa.String(40), sa.ForeignKey("principals.id"), primary_key=True),
        sa.Column("env_name", sa.String(128), primary_key=True),
        sa.Column("ciphertext", sa.Text, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )
    op.create_table(
        "permission_replies",
        sa.Column("task_id", sa.String(40), sa.ForeignKey("task_runs.id"), primary_key=True),
        sa.Column("request_id", sa.String(200), primary_key=True),
        sa.Column("allow", sa.Boolean, nullable=False),
        sa.Column("message", sa.Text),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("sent_at", TS),
    )


def downgrade() -> None:
    for name in ("permission_replies", "credential_values", "credential_profiles", "profiles"):
        op.drop_table(name)
