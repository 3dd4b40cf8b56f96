"""bot: inbound dedup keys (events, messages) with a TTL, chat sessions, and the long-connection lease

Revision ID: 0007_bot
Revises: 0001
"""
from alembic import op
import sqlalchemy as sa

revision = "0007_bot"
down_revision = "0001"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)
metadata = sa.MetaData()

bot_inbound = sa.Table(
    "bot_inbound", metadata,
    sa.Column("key", sa.String(250), primary_key=True),   # "event:<event_id>" / "message:<message_id>"
    sa.Column("app_id", sa.String(64), nullable=False),
    sa.Column("received_at", TS, nullable=False),
    sa.Index("ix_bot_inbound_received", "received_at"),
)

bot_chats = sa.Table(
    "bot_chats", metadata,
    sa.Column("app_id", sa.String(64), primary_key=True),
    sa.Column("chat_id", sa.String(100), primary_key=True),
    sa.Column("principal_id", sa.String(40), primary_key=True),
    sa.Column("session_id", sa.String(40), nullable=False),
    sa.Column("created_at", TS, nullable=False),
)

bot_leases = sa.Table(
    "bot_leases", metadata,
    sa.Column("name", sa.String(100), primary_key=True),  # "longconn:<app_id>"
    sa.Column("holder", sa.String(100), nullable=False),
    sa.Column("expires_at", TS, nullable=False),
)

TABLES = (bot_inbound, bot_chats, bot_leases)


def upgrade() -> None:
    bind = op.get_bind()
    for table in TABLES:
        table.create(bind)


def downgrade() -> None:
    bind = op.get_bind()
    for table in reversed(TABLES):
        table.drop(bind)
