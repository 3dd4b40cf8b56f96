"""recovery: legacy submission records, and the runs and per-schedule outcomes of creator recovery

Revision ID: 0008_recovery
Revises: 0004_schedules, 0006_alerts
"""
from alembic import op
import sqlalchemy as sa

revision = "0008_recovery"
# After the schedules and alert tables it refers to. It was `depends_on = "0006_alerts"`, which Alembic records
# as this revision replacing 0006's version row: naming both as parents describes the same history.
down_revision = ("0004_schedules", "0006_alerts")
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "legacy_submissions",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("schedule_id", sa.String(40), sa.ForeignKey("schedules.id"), nullable=False),
        sa.Column("submitted_at", TS, nullable=False),
        sa.Column("task_id", sa.String(40)),
        sa.Column("detail", sa.JSON),
    )
    op.create_index("ix_legacy_submissions_schedule", "legacy_submissions", ["schedule_id", "submitted_at"])
    op.create_table(
        "recovery_runs",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("cutoff", TS, nullable=False),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("finished_at", TS),
        sa.Column("dry_run", sa.Boolean, nullable=False),
        sa.Column("counts", sa.JSON, nullable=False),
    )
    op.create_table(
        "recovery_results",
        sa.Column("schedule_id", sa.String(40), sa.ForeignKey("schedules.id"), primary_key=True),
        sa.Column("run_id", sa.String(40), sa.ForeignKey("recovery_runs.id"), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("binding_id", sa.String(40)),
        sa.Column("app_id", sa.String(64)),
        sa.Column("creator_id", sa.String(40)),
        sa.Column("recorded_at", TS, nullable=False),
    )
    op.create_index("ix_recovery_results_outcome_app", "recovery_results", ["outcome", "app_id"])


def downgrade() -> None:
    op.drop_table("recovery_results")
    op.drop_table("recovery_runs")
    op.drop_table("legacy_submissions")
