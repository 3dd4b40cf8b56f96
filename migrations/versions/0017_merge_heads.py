"""one history: merge the per-feature branches that grew off 0001 into a single head

Revision ID: 0017_merge_heads
Revises: the twelve heads below (0006_alerts is reached through 0008_recovery, which depends on it)
"""
revision = "0017_merge_heads"
down_revision = ("0002_leases", "0003_profiles", "0007_bot", "0008_recovery", "0010_token_kinds",
                 "0011_box_sessions", "0012_oauth", "0013_identity_links", "0013_schedule_notify", "0014_hub_keys",
                 "0015_questions", "0016_firings_task_index")
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
