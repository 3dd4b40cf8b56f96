"""schedules: durable schedule definitions and their firing ledger

Revision ID: 0004_schedules
Revises: 0001
"""
from alembic import op
import sqlalchemy as sa

revision = "0004_schedules"
down_revision = "0001"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("creator_id", sa.String(40), sa.ForeignKey("principals.id")),
        sa.Column("creator_binding_id", sa.String(40)),
        sa.Column("app_id", sa.String(64)),
        sa.Column("provenance", sa.JSON),
        sa.Column("type", sa.String(16), nullable=False),
        sa.Column("session_ref", sa.String(200)),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("prompt", sa.Text, nullable=False),
        sa.Column("profile", sa.String(200)),
        sa.Column("runtime", sa.String(200)),
        sa.Column("model", sa.String(200)),
        sa.Column("reasoning_effort", sa.String(200)),
        sa.Column("extra_args", sa.JSON),
        sa.Column("permission_policy", sa.String(200)),
        sa.Column("credential_profile", sa.String(200)),
        sa.Column("timeout_s", sa.Float),
        sa.Column("rule", sa.String(200), nullable=False),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("paused", sa.Boolean, nullable=False),
        sa.Column("deleted_at", TS),
        sa.Column("next_fire_at", TS),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )
    op.create_index("ix_schedules_next_fire_at", "schedules", ["next_fire_at"])
    op.create_index("ix_schedules_creator_created", "schedules", ["creator_id", "created_at"])
    op.create_table(
        "firings",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("schedule_id", sa.String(40), sa.ForeignKey("schedules.id"), nullable=False),
        sa.Column("nominal_time", TS, nullable=False),
        sa.Column("fired_at", TS, nullable=False),
        sa.Column("admission", sa.String(500)),
        sa.Column("task_id", sa.String(40)),
        sa.Column("turn_id", sa.String(40)),
        sa.Column("outcome", sa.String(16)),
        sa.Column("missed_count", sa.Integer, nullable=False),
        sa.Column("reconciled_at", TS),
        sa.Column("legacy", sa.Boolean, nullable=False),
        sa.UniqueConstraint("schedule_id", "nominal_time", name="uq_firings_schedule_nominal"),
    )
    op.create_index("ix_firings_reconciled_fired", "firings", ["reconciled_at", "fired_at"])


def downgrade() -> None:
    op.drop_table("firings")
    op.drop_table("schedules")
