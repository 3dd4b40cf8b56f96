"""alerts: Feishu applications, identity bindings, incidents, the persistent outbox and the decision log

Revision ID: 0006_alerts
Revises: 0001
"""
from alembic import op
import sqlalchemy as sa

revision = "0006_alerts"
down_revision = "0001"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)
metadata = sa.MetaData()
# Referenced only (created by 0001), so the foreign key resolves.
sa.Table("principals", metadata, sa.Column("id", sa.String(40), primary_key=True))
feishu_apps = sa.Table(
    "feishu_apps", metadata,
    sa.Column("app_id", sa.String(64), primary_key=True),
    sa.Column("admin_open_id", sa.String(100)),
    sa.Column("admin_changed_at", TS),
    sa.Column("admin_epoch", sa.Integer, nullable=False),
    sa.Column("delivery_state", sa.String(16), nullable=False),
    sa.Column("diagnostic", sa.Text),
    sa.Column("timezone", sa.String(64), nullable=False),
    sa.Column("updated_at", TS, nullable=False),
)

identity_bindings = sa.Table(
    "identity_bindings", metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("principal_id", sa.String(40), sa.ForeignKey("principals.id"), nullable=False),
    sa.Column("app_id", sa.String(64), nullable=False),
    sa.Column("open_id", sa.String(100), nullable=False),
    sa.Column("union_id", sa.String(100)),
    sa.Column("user_id", sa.String(100)),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("created_at", TS, nullable=False),
    sa.UniqueConstraint("app_id", "open_id", name="uq_identity_bindings_app_open"),
    sa.Index("ix_identity_bindings_principal", "principal_id"),
)

incidents = sa.Table(
    "incidents", metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("schedule_id", sa.String(40), nullable=False),
    sa.Column("app_id", sa.String(64), nullable=False),
    sa.Column("creator_id", sa.String(40)),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("active_key", sa.String(40), unique=True),
    sa.Column("failures", sa.Integer, nullable=False),
    sa.Column("missed", sa.Integer, nullable=False),
    sa.Column("unknowns", sa.Integer, nullable=False),
    sa.Column("last_outcome", sa.String(500)),
    sa.Column("last_firing_id", sa.String(40)),
    sa.Column("notify_at", TS),
    sa.Column("opened_at", TS, nullable=False),
    sa.Column("notified_at", TS),
    sa.Column("recovering_since", TS),
    sa.Column("closed_at", TS),
    sa.Column("acked_at", TS),
    sa.Column("acked_by", sa.String(200)),
    sa.Column("snoozed_until", TS),
    sa.Column("last_ping_at", TS),
    sa.Column("card_message_id", sa.String(100)),
    sa.Column("card_sent_at", TS),
    sa.Column("updated_at", TS, nullable=False),
    sa.Index("ix_incidents_state_notify", "state", "notify_at"),
    sa.Index("ix_incidents_schedule", "schedule_id"),
)

outbox = sa.Table(
    "outbox", metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("app_id", sa.String(64), nullable=False),
    sa.Column("recipient", sa.String(100)),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("incident_id", sa.String(40)),
    sa.Column("schedule_id", sa.String(40)),
    sa.Column("payload", sa.JSON, nullable=False),
    sa.Column("request_uuid", sa.String(50), nullable=False, unique=True),
    sa.Column("timezone", sa.String(64), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("next_attempt_at", TS, nullable=False),
    sa.Column("first_attempt_at", TS),
    sa.Column("claimed_by", sa.String(64)),
    sa.Column("claimed_until", TS),
    sa.Column("slot_at", TS),
    sa.Column("digest_id", sa.String(40)),
    sa.Column("message_id", sa.String(100)),
    sa.Column("last_error", sa.Text),
    sa.Column("created_at", TS, nullable=False),
    sa.Column("sent_at", TS),
    sa.Index("ix_outbox_state_next", "state", "next_attempt_at"),
    sa.Index("ix_outbox_recipient_slot", "app_id", "recipient", "slot_at"),
    sa.Index("ix_outbox_incident", "incident_id"),
)

decisions = sa.Table(
    "decisions", metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("at", TS, nullable=False),
    sa.Column("ingest_key", sa.String(60), unique=True),
    sa.Column("firing_id", sa.String(40)),
    sa.Column("schedule_id", sa.String(40)),
    sa.Column("incident_id", sa.String(40)),
    sa.Column("notice_id", sa.String(40)),
    sa.Column("outcome", sa.String(500)),
    sa.Column("decision", sa.String(32), nullable=False),
    sa.Column("detail", sa.Text),
    sa.Index("ix_decisions_firing", "firing_id"),
    sa.Index("ix_decisions_incident", "incident_id"),
)

TABLES = (feishu_apps, identity_bindings, incidents, outbox, decisions)


def upgrade() -> None:
    bind = op.get_bind()
    for table in TABLES:
        table.create(bind)


def downgrade() -> None:
    bind = op.get_bind()
    for table in reversed(TABLES):
        table.drop(bind)
