"""chat turns: each chat message's Turn, its progress card and what the chat was told, kept in the database so any
replica drives the card to the answer; outbox notices name their Turn; a steer may target a Session's Turn (no
instance)

Revision ID: 0027_chat_turns
Revises: 0026_agent_timeline
"""
from alembic import op
import sqlalchemy as sa

revision = "0027_chat_turns"
down_revision = "0026_agent_timeline"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "chat_turns",
        sa.Column("turn_id", sa.String(40), primary_key=True),
        sa.Column("app_id", sa.String(64), nullable=False),
        sa.Column("chat_id", sa.String(100), nullable=False),
        sa.Column("open_id", sa.String(100), nullable=False),
        sa.Column("principal_id", sa.String(40), nullable=False),
        sa.Column("session_id", sa.String(40), nullable=False),
        sa.Column("reply_to", sa.String(100), nullable=False),
        sa.Column("card_notice_id", sa.String(40), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("rendered", sa.String(64)),
        sa.Column("notes", sa.JSON, nullable=False),
        sa.Column("updated_at", TS),
        sa.Column("next_check_at", TS, nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index("ix_chat_turns_state_next", "chat_turns", ["state", "next_check_at"])
    op.create_index("ix_chat_turns_chat", "chat_turns", ["app_id", "chat_id", "principal_id", "state"])
    with op.batch_alter_table("outbox") as batch:
        batch.add_column(sa.Column("turn_id", sa.String(40)))
        batch.create_index("ix_outbox_turn", ["turn_id"])
    with op.batch_alter_table("mailbox") as batch:
        batch.alter_column("instance_id", existing_type=sa.String(40), nullable=True)


def downgrade() -> None:
    with op.batch_alter_table("mailbox") as batch:
        batch.execute("DELETE FROM mailbox WHERE instance_id IS NULL")  # pre-0027 mailboxes belong to instances
        batch.alter_column("instance_id", existing_type=sa.String(40), nullable=False)
    with op.batch_alter_table("outbox") as batch:
        batch.drop_index("ix_outbox_turn")
        batch.drop_column("turn_id")
    op.drop_index("ix_chat_turns_chat", "chat_turns")
    op.drop_index("ix_chat_turns_state_next", "chat_turns")
    op.drop_table("chat_turns")
