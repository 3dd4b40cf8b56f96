"""session questions: a direct Session's Turn that ended waiting for the person, and how it was answered

Revision ID: 0015_questions
Revises: 0005_sessions
"""
from alembic import op
import sqlalchemy as sa

revision = "0015_questions"
down_revision = "0005_sessions"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "session_questions",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("turn_id", sa.String(40), sa.ForeignKey("task_runs.id"), nullable=False, unique=True),
        sa.Column("session_id", sa.String(40), sa.ForeignKey("sessions.id"), nullable=False),
        sa.Column("owner_id", sa.String(40), nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("options", sa.JSON, nullable=False),
        sa.Column("free_text", sa.Boolean, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("answer", sa.Text),
        sa.Column("answer_turn_id", sa.String(40)),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("closed_at", TS),
    )
    op.create_index("ix_session_questions_session_state", "session_questions", ["session_id", "state"])


def downgrade() -> None:
    op.drop_index("ix_session_questions_session_state", table_name="session_questions")
    op.drop_table("session_questions")
