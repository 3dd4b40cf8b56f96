"""Table definitions used by queries; Alembic migrations are the only source of the schema."""
from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()
TS = sa.DateTime(timezone=True)

principals = sa.Table(
    "principals", metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("name", sa.String(200), nullable=False, unique=True),
    sa.Column("created_at", TS, nullable=False),
    # set: the principal's execution access is revoked (its Feishu schedule views and actions show nothing)
    sa.Column("execution_revoked_at", TS),
)

api_tokens = sa.Table(
    "api_tokens", metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("principal_id", sa.String(40), sa.ForeignKey("principals.id"), nullable=False, index=True),
    sa.Column("label", sa.String(200)),
    sa.Column("token_hash", sa.String(64), nullable=False),
    sa.Column("admin", sa.Boolean, nullable=False, default=False),
    sa.Column("created_at", TS, nullable=False),
    sa.Column("last_used_at", TS),
    sa.Column("revoked_at", TS),
    # user | admin | runner (only /runner/ws; `admin` set = made by an admin: registers shared runtimes)
    # | run (minted per task run, revoked when it ends; `task_id` names the run)
    sa.Column("kind", sa.String(16), nullable=False, server_default="user"),
    sa.Column("task_id", sa.String(40)),
    sa.Index("ix_api_tokens_task", "task_id"),
)

runtimes = sa.Table(
    "runtimes", metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("name", sa.String(200), nullable=False, unique=True),
    sa.Column("principal_id", sa.String(40), sa.ForeignKey("principals.id"), nullable=False),
    sa.Column("shared", sa.Boolean, nullable=False),
    sa.Column("capabilities", sa.JSON, nullable=False),
    sa.Column("slots", sa.Integer, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("connection_id", sa.String(40)),
    sa.Column("registered_at", TS, nullable=False),
    sa.Column("last_seen_at", TS, nullable=False),
    sa.Column("token_id", sa.String(40)),  # the token that registered the name; another is refused (0017)
)

task_runs = sa.Table(
    "task_runs", metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("owner_id", sa.String(40), sa.ForeignKey("principals.id"), nullable=False),
    sa.Column("name", sa.String(200)),
    sa.Column("prompt", sa.Text, nullable=False),
    sa.Column("snapshot", sa.JSON, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("outcome", sa.String(16)),
    sa.Column("error", sa.Text),
    sa.Column("result_text", sa.Text),
    sa.Column("result_json", sa.JSON),
    sa.Column("usage_json", sa.JSON),
    sa.Column("changed_files", sa.JSON),
    sa.Column("runtime_id", sa.String(40), index=True),
    sa.Column("attempt", sa.Integer, nullable=False, default=0),
    sa.Column("event_seq", sa.Integer, nullable=False, default=0),
    sa.Column("last_rseq", sa.Integer, nullable=False, default=0),
    sa.Column("cancel_requested_at", TS),
    sa.Column("deadline_at", TS),
    sa.Column("created_at", TS, nullable=False),
    sa.Column("dispatched_at", TS),
    sa.Column("started_at", TS),
    sa.Column("finished_at", TS),
    sa.Column("parent_session_id", sa.String(40)),
    sa.Column("parent_turn_id", sa.String(40)),
    sa.Column("instance_id", sa.String(40)),
    sa.Column("kind", sa.String(16), nullable=False, server_default="task"),  # task | turn
    sa.Column("session_id", sa.String(40)),
    sa.Column("turn_seq", sa.Integer),
    sa.Column("resume_handle", sa.String(400)),
    sa.Index("ix_task_runs_owner_created", "owner_id", "created_at"),
    sa.Index("ix_task_runs_session", "session_id", "turn_seq"),
    sa.Index("ix_task_runs_instance", "instance_id", "created_at"),
    sa.Index("ix_task_runs_status_created", "status", "created_at"),
)

reservations = sa.Table(
    "reservations", metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("runtime_id", sa.String(40), sa.ForeignKey("runtimes.id"), nullable=False),
    sa.Column("task_id", sa.String(40), sa.ForeignKey("task_runs.id"), nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("created_at", TS, nullable=False),
    sa.Column("expires_at", TS, nullable=False),
    sa.Column("sent_at", TS),
    sa.Column("released_at", TS),
    sa.Index("ix_reservations_state_runtime", "state", "runtime_id"),
    sa.Index("ix_reservations_task", "task_id"),
)

task_events = sa.Table(
    "task_events", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("task_id", sa.String(40), sa.ForeignKey("task_runs.id"), nullable=False),
    sa.Column("seq", sa.Integer, nullable=False),
    sa.Column("type", sa.String(32), nullable=False),
    sa.Column("payload", sa.JSON, nullable=False),
    sa.Column("turn_id", sa.String(40)),
    sa.Column("created_at", TS, nullable=False),
    sa.UniqueConstraint("task_id", "seq", name="uq_task_events_task_seq"),
)

# The Agent Timeline: raw agent events of one run (a Task or a Turn), keyed by the runner's sequence; swept after
# `timeline.retention_s` (hub/services/tasks/timeline.py).
timeline_events = sa.Table(
    "timeline_events", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.String(40), nullable=False),
    sa.Column("rseq", sa.Integer, nullable=False),
    sa.Column("type", sa.String(32), nullable=False),
    sa.Column("payload", sa.JSON, nullable=False),
    sa.Column("created_at", TS, nullable=False),
    sa.UniqueConstraint("run_id", "rseq", name="uq_timeline_events_run_rseq"),
    sa.Index("ix_timeline_events_created", "created_at"),
)

lease_tasks = sa.Table(
    "lease_tasks", metadata,
    sa.Column("id", sa.String(48), primary_key=True),
    sa.Column("owner_id", sa.String(40), sa.ForeignKey("principals.id"), nullable=False),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("holder_label", sa.String(200)),
    sa.Column("holder_token_id", sa.String(40)),
    sa.Column("secret_hash", sa.String(64)),
    sa.Column("attached_at", TS),
    sa.Column("last_activity_at", TS, nullable=False),
    sa.Column("released_at", TS),
    sa.Column("closed_at", TS),
    sa.Column("closed_reason", sa.String(200)),
    sa.Column("created_at", TS, nullable=False),
    sa.Index("ix_lease_tasks_owner_status", "owner_id", "status"),
    sa.Index("ix_lease_tasks_status_activity", "status", "last_activity_at"),
)

boxes = sa.Table(
    "boxes", metadata,
    sa.Column("id", sa.String(48), primary_key=True),
    sa.Column("task_id", sa.String(48), sa.ForeignKey("lease_tasks.id"), nullable=False),
    sa.Column("name", sa.String(200)),
    sa.Column("driver", sa.String(32), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("handle", sa.JSON),
    sa.Column("created_at", TS, nullable=False),
    sa.Column("destroyed_at", TS),
    sa.Index("ix_boxes_task_state", "task_id", "state"),
    sa.Index("ix_boxes_state", "state"),
)

profiles = sa.Table(
    "profiles", metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("engine", sa.String(32), nullable=False),
    sa.Column("manifest", sa.JSON, nullable=False),
    sa.Column("digest", sa.String(80), nullable=False),
    sa.Column("created_by", sa.String(40), sa.ForeignKey("principals.id"), nullable=False),
    sa.Column("created_at", TS, nullable=False),
    sa.Column("updated_at", TS, nullable=False),
)

credential_profiles = sa.Table(
    "credential_profiles", metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("env_names", sa.JSON, nullable=False),
    sa.Column("created_by", sa.String(40), sa.ForeignKey("principals.id"), nullable=False),
    sa.Column("created_at", TS, nullable=False),
)

credential_values = sa.Table(
    "credential_values", metadata,
    sa.Column("profile_name", sa.String(64), sa.ForeignKey("credential_profiles.name"), primary_key=True),
    sa.Column("principal_id", sa.String(40), sa.ForeignKey("principals.id"), primary_key=True),
    sa.Column("env_name", sa.String(128), primary_key=True),
    sa.Column("ciphertext", sa.Text, nullable=False),
    sa.Column("updated_at", TS, nullable=False),
)

permission_replies = sa.Table(
    "permission_replies", metadata,
    sa.Column("task_id", sa.String(40), sa.ForeignKey("task_runs.id"), primary_key=True),
    sa.Column("request_id", sa.String(200), primary_key=True),
    sa.Column("allow", sa.Boolean, nullable=False),
    sa.Column("message", sa.Text),
    sa.Column("created_at", TS, nullable=False),
    sa.Column("sent_at", TS),
)

sessions = sa.Table(
    "sessions", metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("name", sa.String(200)),
    sa.Column("owner_id", sa.String(40), sa.ForeignKey("principals.id"), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("source", sa.String(32), nullable=False),
    sa.Column("engine", sa.String(32), nullable=False),
    sa.Column("model", sa.String(200)),
    sa.Column("reasoning_effort", sa.String(16)),
    sa.Column("snapshot", sa.JSON, nullable=False),
    sa.Column("runtime_id", sa.String(40)),
    sa.Column("resume_handle", sa.String(400)),
    sa.Column("parent_session_id", sa.String(40)),
    sa.Column("turns", sa.Integer, nullable=False),
    sa.Column("memory_scope", sa.String(200)),
    sa.Column("created_at", TS, nullable=False),
    sa.Column("updated_at", TS, nullable=False),
    sa.Index("ix_sessions_owner_name", "owner_id", "name"),
)

session_questions = sa.Table(
    "session_questions", metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("turn_id", sa.String(40), sa.ForeignKey("task_runs.id"), nullable=False, unique=True),
    sa.Column("session_id", sa.String(40), sa.ForeignKey("sessions.id"), nullable=False),
    sa.Column("owner_id", sa.String(40), nullable=False),
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("options", sa.JSON, nullable=False),
    sa.Column("free_text", sa.Boolean, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),  # open | answered | withdrawn
    sa.Column("answer", sa.Text),
    sa.Column("answer_turn_id", sa.String(40)),
    sa.Column("created_at", TS, nullable=False),
    sa.Column("closed_at", TS),
    sa.Index("ix_session_questions_session_state", "session_id", "state"),
)

instances = sa.Table(
    "instances", metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("owner_id", sa.String(40), sa.ForeignKey("principals.id"), nullable=False),
    sa.Column("name", sa.String(200)),
    sa.Column("session_id", sa.String(40), nullable=False),
    sa.Column("snapshot", sa.JSON, nullable=False),
    sa.Column("archived_at", TS),
    sa.Column("current_task_id", sa.String(40)),
    sa.Column("created_at", TS, nullable=False),
    sa.Column("updated_at", TS, nullable=False),
)

mailbox = sa.Table(
    "mailbox", metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("instance_id", sa.String(40), sa.ForeignKey("instances.id")),  # None: a steer of a Session's Turn
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("task_id", sa.String(40)),
    sa.Column("created_at", TS, nullable=False),
    sa.Column("sent_at", TS),
    sa.Column("settled_at", TS),
    sa.Column("note", sa.String(1000)),  # why a steer was queued rather than delivered (the runner's reason)
    sa.Index("ix_mailbox_instance_state", "instance_id", "state"),
)

memory = sa.Table(
    "memory", metadata,
    sa.Column("scope", sa.String(200), primary_key=True),
    sa.Column("key", sa.String(200), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
    sa.Column("updated_at", TS, nullable=False),
)

schedules = sa.Table(
    "schedules", metadata,
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
    sa.Column("notify", sa.String(16), nullable=False, server_default="failures"),  # 0013_schedule_notify
    sa.Column("overlap", sa.String(16), nullable=False, server_default="allow"),  # 0020_schedule_overlap
    sa.Column("deleted_at", TS),
    sa.Column("next_fire_at", TS),
    sa.Column("created_at", TS, nullable=False),
    sa.Column("updated_at", TS, nullable=False),
    sa.Index("ix_schedules_next_fire_at", "next_fire_at"),
    sa.Index("ix_schedules_creator_created", "creator_id", "created_at"),
)

firings = sa.Table(
    "firings", metadata,
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
    sa.Column("manual", sa.Boolean, nullable=False, server_default=sa.false()),  # 0022: schedule_run_now
    sa.UniqueConstraint("schedule_id", "nominal_time", "manual", name="uq_firings_schedule_nominal_manual"),
    sa.Index("ix_firings_reconciled_fired", "reconciled_at", "fired_at"),
    sa.Index("ix_firings_task_id", "task_id"),
)

# ---------------------------------------------------------------- alerts (0006_alerts)

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
    sa.Column("ack_comment", sa.String(1000)),
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
    sa.Column("turn_id", sa.String(40)),  # a chat output: the Turn it is about
    sa.Index("ix_outbox_state_next", "state", "next_attempt_at"),
    sa.Index("ix_outbox_recipient_slot", "app_id", "recipient", "slot_at"),
    sa.Index("ix_outbox_incident", "incident_id"),
    sa.Index("ix_outbox_turn", "turn_id"),
)

chat_turns = sa.Table(
    "chat_turns", metadata,
    sa.Column("turn_id", sa.String(40), primary_key=True),
    sa.Column("app_id", sa.String(64), nullable=False),
    sa.Column("chat_id", sa.String(100), nullable=False),
    sa.Column("open_id", sa.String(100), nullable=False),
    sa.Column("principal_id", sa.String(40), nullable=False),
    sa.Column("session_id", sa.String(40), nullable=False),
    sa.Column("reply_to", sa.String(100), nullable=False),      # the message the progress card answers
    sa.Column("card_notice_id", sa.String(40), nullable=False),  # the outbox notice that is the progress card
    sa.Column("state", sa.String(16), nullable=False),           # running | done
    sa.Column("rendered", sa.String(64)),                        # digest of the card last queued
    sa.Column("notes", sa.JSON, nullable=False),                 # what became of messages sent during the Turn
    sa.Column("updated_at", TS),                                 # when the last card update was queued
    sa.Column("next_check_at", TS, nullable=False),
    sa.Column("created_at", TS, nullable=False),
    sa.Index("ix_chat_turns_state_next", "state", "next_check_at"),
    sa.Index("ix_chat_turns_chat", "app_id", "chat_id", "principal_id", "state"),
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

# ---------------------------------------------------------------- Feishu bot (0007_bot)

bot_inbound = sa.Table(
    "bot_inbound", metadata,
    sa.Column("key", sa.String(250), primary_key=True),
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
    sa.Column("name", sa.String(100), primary_key=True),
    sa.Column("holder", sa.String(100), nullable=False),
    sa.Column("expires_at", TS, nullable=False),
)

# ---------------------------------------------------------------- creator recovery (0008_recovery)

legacy_submissions = sa.Table(
    "legacy_submissions", metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("schedule_id", sa.String(40), sa.ForeignKey("schedules.id"), nullable=False),
    sa.Column("submitted_at", TS, nullable=False),
    sa.Column("task_id", sa.String(40)),
    sa.Column("detail", sa.JSON),
    sa.Index("ix_legacy_submissions_schedule", "schedule_id", "submitted_at"),
)

upgrade_marks = sa.Table(  # times migrations recorded when they ran (`creator_recovery_cutoff`: 0024)
    "upgrade_marks", metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("at", TS, nullable=False),
)

recovery_runs = sa.Table(
    "recovery_runs", metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("cutoff", TS, nullable=False),
    sa.Column("started_at", TS, nullable=False),
    sa.Column("finished_at", TS),
    sa.Column("dry_run", sa.Boolean, nullable=False),
    sa.Column("counts", sa.JSON, nullable=False),
)

recovery_results = sa.Table(
    "recovery_results", metadata,
    sa.Column("schedule_id", sa.String(40), sa.ForeignKey("schedules.id"), primary_key=True),
    sa.Column("run_id", sa.String(40), sa.ForeignKey("recovery_runs.id"), nullable=False),
    sa.Column("outcome", sa.String(16), nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("binding_id", sa.String(40)),
    sa.Column("app_id", sa.String(64)),
    sa.Column("creator_id", sa.String(40)),
    sa.Column("recorded_at", TS, nullable=False),
    sa.Index("ix_recovery_results_outcome_app", "outcome", "app_id"),
)

# ---------------------------------------------------------------- OAuth for hosted MCP clients (0012_oauth)

oauth_clients = sa.Table(
    "oauth_clients", metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("secret_hash", sa.String(64)),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("redirect_uris", sa.JSON, nullable=False),
    sa.Column("scope", sa.String(200), nullable=False),
    sa.Column("auth_method", sa.String(32), nullable=False),
    sa.Column("info", sa.JSON, nullable=False),
    sa.Column("created_at", TS, nullable=False),
)

oauth_grants = sa.Table(
    "oauth_grants", metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("client_id", sa.String(64), sa.ForeignKey("oauth_clients.id"), nullable=False),
    sa.Column("principal_id", sa.String(40), sa.ForeignKey("principals.id"), nullable=False),
    sa.Column("scope", sa.String(200), nullable=False),
    sa.Column("resource", sa.Text),
    sa.Column("created_at", TS, nullable=False),
    sa.Column("revoked_at", TS),
    sa.Column("revoked_reason", sa.String(200)),
    sa.Column("approved_by", sa.String(40)),  # the amux token that approved it (None: a browser sign-in); 0017
    sa.Index("ix_oauth_grants_principal", "principal_id"),
    sa.Index("ix_oauth_grants_approved_by", "approved_by"),
)

oauth_codes = sa.Table(
    "oauth_codes", metadata,
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
    sa.Column("approved_by", sa.String(40)),  # carried to the grant it issues (0017)
)

oauth_tokens = sa.Table(
    "oauth_tokens", metadata,
    sa.Column("token_hash", sa.String(64), primary_key=True),
    sa.Column("grant_id", sa.String(40), sa.ForeignKey("oauth_grants.id"), nullable=False),
    sa.Column("kind", sa.String(8), nullable=False),
    sa.Column("scope", sa.String(200), nullable=False),
    sa.Column("expires_at", TS, nullable=False),
    sa.Column("rotated_at", TS),
    sa.Column("created_at", TS, nullable=False),
    sa.Index("ix_oauth_tokens_grant", "grant_id"),
)

oauth_logins = sa.Table(
    "oauth_logins", metadata,
    sa.Column("secret_hash", sa.String(64), primary_key=True),
    sa.Column("kind", sa.String(8), nullable=False),
    sa.Column("principal_id", sa.String(40), sa.ForeignKey("principals.id"), nullable=False),
    sa.Column("expires_at", TS, nullable=False),
    sa.Column("used_at", TS),
    sa.Column("created_at", TS, nullable=False),
)

hub_keys = sa.Table(
    "hub_keys", metadata,
    sa.Column("name", sa.String(64), primary_key=True),   # what the key signs, e.g. "mcp-session"
    sa.Column("secret", sa.String(128), nullable=False),  # random, hex; never leaves the database and the replicas
    sa.Column("created_at", TS, nullable=False),
)

# ---------------------------------------------------------------- Boxes page sessions (0011_box_sessions)

box_sessions = sa.Table(
    "box_sessions", metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("principal_id", sa.String(40), sa.ForeignKey("principals.id"), nullable=False),
    sa.Column("token_id", sa.String(40), nullable=False),  # the API token that signed in; revoking it ends the session
    sa.Column("session_hash", sa.String(64), nullable=False),  # SHA-256 of the cookie's secret; never the secret
    sa.Column("created_at", TS, nullable=False),
    sa.Column("expires_at", TS, nullable=False),
    sa.Column("revoked_at", TS),
    sa.UniqueConstraint("session_hash", name="uq_box_sessions_hash"),
    sa.Index("ix_box_sessions_principal", "principal_id"),
)


# ---------------------------------------------------------------- identity links (0013_identity_links)

identity_link_codes = sa.Table(
    "identity_link_codes", metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("principal_id", sa.String(40), sa.ForeignKey("principals.id"), nullable=False),
    sa.Column("code_hash", sa.String(64), nullable=False),
    sa.Column("created_at", TS, nullable=False),
    sa.Column("expires_at", TS, nullable=False),
    sa.Column("used_at", TS),
    sa.Column("binding_id", sa.String(40)),
    sa.UniqueConstraint("code_hash", name="uq_identity_link_codes_hash"),
    sa.Index("ix_identity_link_codes_principal", "principal_id"),
)

execution_uids = sa.Table(
    "execution_uids", metadata,
    sa.Column("principal_id", sa.String(40), sa.ForeignKey("principals.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("uid", sa.Integer, nullable=False, unique=True),
    sa.Column("created_at", TS, nullable=False),
)
