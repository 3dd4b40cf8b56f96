"""manual firings: a firing asked for by `schedule_run_now` is ledgered like any other, flagged `manual`, and is
unique per schedule + nominal time + manual (so a manual run at a rule's own fire time never collides with it)

Revision ID: 0022_manual_firings
Revises: 0021_ack_comment
"""
from alembic import op
import sqlalchemy as sa

revision = "0022_manual_firings"
down_revision = "0021_ack_comment"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Every existing firing came from its rule: not manual.
    with op.batch_alter_table("firings") as batch:
        batch.add_column(sa.Column("manual", sa.Boolean, nullable=False, server_default=sa.false()))
        batch.create_unique_constraint("uq_firings_schedule_nominal_manual", ["schedule_id", "nominal_time", "manual"])
        # contract-ok: the new key still holds every rule firing (manual = false) once, as old replicas need
        batch.drop_constraint("uq_firings_schedule_nominal", type_="unique")


def downgrade() -> None:
    with op.batch_alter_table("firings") as batch:
        batch.drop_constraint("uq_firings_schedule_nominal_manual", type_="unique")
        batch.execute("DELETE FROM firings WHERE manual")  # pre-0022 ledgers know no manual firing
        batch.create_unique_constraint("uq_firings_schedule_nominal", ["schedule_id", "nominal_time"])
        batch.drop_column("manual")
