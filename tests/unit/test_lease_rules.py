"""Lease rules (seed: Rift tasks), table-driven: one case per rule, `now` passed in."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from hub.domain import leases as rules

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=timezone.utc)
MIN = timedelta(minutes=1)


# --- handles ------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw, refusal", [
    (None, rules.NO_HANDLE),                              # no handle → rift_task_new opens one
    ("", rules.NO_HANDLE),
    ("   ", rules.NO_HANDLE),
    ("task_k3v9q2mx", rules.MALFORMED),                   # no dot: the id alone buys nothing
    ("lease_k3v9q2mx.abc", rules.MALFORMED),              # wrong prefix
    ("task_k3v9q2mx.", rules.MALFORMED),                  # empty secret
    (".abc", rules.MALFORMED),                            # empty id
    ("task_K3V9.abc", rules.MALFORMED),                   # id outside the alphabet
    ("task_k3v9q2mx.abc.def", rules.MALFORMED),           # two dots
    ("task_k3v9q2mx.a b", rules.MALFORMED),               # secret outside urlsafe base64
    ("task_k3v9q2mx." + "x" * 10_000, rules.MALFORMED),   # 10 KB of junk
    ("\x00" * 10_240, rules.MALFORMED),
], ids=["none", "empty", "blank", "no-dot", "wrong-prefix", "empty-secret", "empty-id", "bad-id-chars",
        "two-dots", "bad-secret-chars", "oversized-secret", "10kb-nul-junk"])
def test_a_malformed_handle_is_refused_with_text_naming_rift_task_new(raw, refusal):
    with pytest.raises(rules.HandleError) as e:
        rules.parse_handle(raw)
    assert str(e.value) == refusal and "rift_task_new" in str(e.value)


def test_malformed_handle_refusals_never_echo_the_input():
    junk = "task_abc." + "S3CRET" * 2000
    with pytest.raises(rules.HandleError) as e:
        rules.parse_handle(junk)
    assert "S3CRET" not in str(e.value) and len(str(e.value)) < 300


def test_a_handle_is_task_id_dot_secret():
    h = rules.parse_handle(" task_k3v9q2mx.Ab-_09 ")
    assert h == rules.Handle("task_k3v9q2mx", "Ab-_09")
    assert rules.format_handle(h.task_id, h.secret) == "task_k3v9q2mx.Ab-_09"


@pytest.mark.parametrize("raw, expected", [
    ("task_k3v9q2mx", "task_k3v9q2mx"),             # the id as rift_task_list shows it
    ("task_k3v9q2mx.oldsecret", "task_k3v9q2mx"),   # a whole (stale) handle: its secret is ignored
])
def test_attach_accepts_a_task_id_or_a_whole_handle(raw, expected):
    assert rules.parse_task_id(raw) == expected


@pytest.mark.parametrize("raw", [None, "", "k3v9q2mx", "vm_k3v9q2mx", "task_" + "a" * 10_000])
def test_a_malformed_task_id_is_refused_with_text_naming_the_listing_tool(raw):
    with pytest.raises(rules.HandleError, match="rift_task_list"):
        rules.parse_task_id(raw)


@pytest.mark.parametrize("raw", [None, "", "task_abc", "vm_", "vm_ABC", "vm_abc; rm -rf /", "vm_" + "a" * 100])
def test_a_malformed_box_id_is_refused_with_text_naming_rift_vm_list(raw):
    with pytest.raises(rules.HandleError, match="rift_vm_list"):
        rules.parse_box_id(raw)


@pytest.mark.parametrize("raw, required, ok", [
    ("fix login", True, "fix login"),
    ("  spaced  ", True, "spaced"),
    ("bell\x07 ring", True, "bell ring"),   # control characters are dropped
    (None, False, None),                    # a box name is optional
    ("", True, ValueError),                 # a task name is required
    ("x" * 201, True, ValueError),          # at most 200 characters
])
def test_names_are_printable_and_at_most_200_characters(raw, required, ok):
    if ok is ValueError:
        with pytest.raises(ValueError):
            rules.clean_name(raw, required=required, what="task")
    else:
        assert rules.clean_name(raw, required=required, what="task") == ok


# --- clocks -------------------------------------------------------------------------------------

@pytest.mark.parametrize("last, now, due", [
    (None, T0, True),                           # never recorded → record now
    (T0, T0 + 59 * timedelta(seconds=1), False),  # within the minute → the stored time stays
    (T0, T0 + MIN, True),                       # a minute later → it moves
    (T0, T0 + 90 * MIN, True),
])
def test_stored_activity_moves_at_most_once_a_minute(last, now, due):
    assert rules.activity_due(last, now, 60) is due


@pytest.mark.parametrize("held, quiet, may", [
    (True, 29 * MIN + timedelta(seconds=59), False),  # active lately → takeover needed
    (True, 30 * MIN, True),                           # quiet for 30 minutes → taken up without asking
    (True, 5 * 60 * MIN, True),
    (False, timedelta(0), True),                      # released → anyone of the owner's agents may attach
])
def test_a_lease_quiet_for_30_minutes_may_be_taken_up_without_asking(held, quiet, may):
    assert rules.may_attach_without_takeover(held, T0, T0 + quiet, 1800) is may


@pytest.mark.parametrize("quiet, due", [
    (4 * 60 * MIN - timedelta(seconds=1), False),
    (4 * 60 * MIN, True),            # quiet for 4 hours → closes itself
    (10 * 60 * MIN, True),
])
def test_a_task_quiet_for_4_hours_is_due_to_close_itself(quiet, due):
    assert rules.auto_close_due(T0, T0 + quiet, 14400) is due
    assert (T0 <= rules.auto_close_cutoff(T0 + quiet, 14400)) is due


def test_a_touch_restarts_the_auto_close_timer():
    touched = T0 + 3 * 60 * MIN
    assert not rules.auto_close_due(touched, T0 + 4 * 60 * MIN, 14400)
    assert rules.auto_close_due(touched, touched + 4 * 60 * MIN, 14400)


@pytest.mark.parametrize("delta, text", [
    (timedelta(seconds=30), "just now"),
    (3 * MIN, "3 min ago"),
    (125 * MIN, "2 h 5 min ago"),
    (26 * 60 * MIN, "1 d 2 h ago"),
    (-MIN, "just now"),               # a clock skew never shows negative time
])
def test_quiet_time_reads_for_people(delta, text):
    assert rules.ago(T0, T0 + delta) == text


# --- refusal texts: each names the tool that mends it ---------------------------------------------

@pytest.mark.parametrize("text, must_contain", [
    (rules.not_yours("task_abc"), ["task_abc", "does not exist or is not yours", "rift_task_list"]),
    (rules.closed("task_abc", "quiet for 4 hours"),
     ["task_abc is closed", "its VMs are gone", "`rift_task_new` opens another"]),
    (rules.released("task_abc"), ["task_abc was released", "`rift_task_attach task_abc` takes it up"]),
    (rules.held_by("mcp:Claude", T0), ["held by mcp:Claude since 2026-01-05T09:00:00Z",
                                       "`rift_task_attach` with takeover takes it over — tell the user"]),
    (rules.attach_refused("task_abc", "mcp:Claude", T0, T0 + 2 * MIN, T0 + 5 * MIN, 1800),
     ["held by mcp:Claude since 2026-01-05T09:00:00Z", "active 3 min ago", "takeover=true", "tell the user",
      "2026-01-05T09:32:00Z"]),
    (rules.box_not_in_task("vm_x", "task_abc"), ["vm_x", "task_abc", "rift_vm_list"]),
], ids=["not-yours", "closed", "released", "held-by", "attach-refused", "box-not-in-task"])
def test_every_refusal_names_the_tool_that_mends_it(text, must_contain):
    for part in must_contain:
        assert part in text


@pytest.mark.parametrize("env, key", [
    ({"AMUX_BOXES__DRIVER": "podman"}, "boxes.driver"),
    ({"AMUX_BOXES__NETWORK": "bridge"}, "boxes.network"),
], ids=["driver", "network"])
def test_an_unknown_box_driver_or_network_is_refused_at_start_naming_the_fix(env, key):
    from hub.config_sources import load_settings
    from hub.errors import Invalid

    with pytest.raises(Invalid) as e:
        load_settings(env=env, home="/nonexistent-amux-home")
    assert key in e.value.message and "AMUX_" in e.value.message


def test_box_settings_come_from_the_environment_form():
    from hub.config_sources import load_settings

    s = load_settings(env={"AMUX_BOXES__DRIVER": "unsandboxed", "AMUX_BOXES__NETWORK": "host",
                           "AMUX_BOXES__MAX_PER_TASK": "3", "AMUX_BOXES__MEMORY_MB": "512",
                           "AMUX_BOXES__PIDS_MAX": "100", "AMUX_BOXES__CPUS": "0.5"}, home="/nonexistent-amux-home")
    assert (s.boxes.driver, s.boxes.network, s.boxes.max_per_task, s.boxes.memory_mb, s.boxes.pids_max,
            s.boxes.cpus) == ("unsandboxed", "host", 3, 512, 100, 0.5)


def test_a_task_holds_any_number_of_boxes_by_default_and_the_limits_are_per_principal():
    from hub.config_sources import load_settings

    s = load_settings(env={}, home="/nonexistent-amux-home")
    assert (s.boxes.max_per_task, s.boxes.max_live_per_principal, s.leases.max_open_tasks_per_principal,
            s.boxes.shm_mb) == (0, 8, 20, 64)
    s = load_settings(env={"AMUX_BOXES__MAX_LIVE_PER_PRINCIPAL": "0", "AMUX_LEASES__MAX_OPEN_TASKS_PER_PRINCIPAL": "5",
                           "AMUX_BOXES__SHM_MB": "16"}, home="/nonexistent-amux-home")
    assert (s.boxes.max_live_per_principal, s.leases.max_open_tasks_per_principal, s.boxes.shm_mb) == (0, 5, 16)


@pytest.mark.parametrize("network, shares_net", [("none", False), ("host", True)])
def test_a_box_init_unshares_every_namespace_and_binds_only_system_directories(network, shares_net, tmp_path):
    from hub.boxes.bwrap import init_argv

    argv = init_argv("bwrap", "vm_abc", network=network, disk_bytes=1 << 20, shm_bytes=1 << 20, hide=[tmp_path],
                     info_fd=9)
    assert argv[:3] == ["bwrap", "--unshare-all", "--unshare-user"] and ("--share-net" in argv) is shares_net
    assert {"--new-session", "--disable-userns", "--clearenv"} <= set(argv) and "--die-with-parent" not in argv
    binds = [argv[i + 1] for i, a in enumerate(argv) if a in ("--ro-bind", "--bind") and argv[i + 1] != "/dev/null"]
    assert binds and all(b in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
                         for b in binds)
    assert "--bind" not in argv and str(tmp_path) not in argv and "/" not in binds  # nothing writable of the host
    assert argv[argv.index("--cap-drop") + 1] == "ALL"
    if Path("/etc/shadow").exists():
        assert argv[argv.index("/etc/shadow") - 2:argv.index("/etc/shadow")] == ["--ro-bind", "/dev/null"]
    assert ["--remount-ro", "/"] == argv[argv.index("--remount-ro", argv.index("/box")):][:2]


def test_every_tmpfs_of_a_box_has_a_size_and_its_dev_is_a_small_read_only_one(tmp_path):
    from hub.boxes.bwrap import DEV_BYTES, init_argv

    argv = init_argv("bwrap", "vm_abc", network="none", disk_bytes=8 << 20, shm_bytes=2 << 20, hide=[tmp_path],
                     info_fd=9)
    at = [i for i, a in enumerate(argv) if a == "--tmpfs"]
    assert at and all(argv[i - 2] == "--size" and int(argv[i - 1]) > 0 for i in at)
    sizes = {argv[i + 1]: int(argv[i - 1]) for i in at}
    assert (sizes["/dev"], sizes["/dev/shm"], sizes["/tmp"], sizes["/box"]) == (DEV_BYTES, 2 << 20, 8 << 20, 8 << 20)
    assert "--dev" not in argv  # bwrap's own /dev is a tmpfs it cannot size
    assert argv[argv.index("--remount-ro", argv.index("/dev/shm")) + 1] == "/dev"


def test_entering_a_box_drops_every_capability_before_the_command():
    from hub.boxes.bwrap import enter_argv

    argv = enter_argv(4242, "echo hi")
    assert argv[:3] == ["nsenter", "-t", "4242"]
    assert {"--user", "--mount", "--pid", "--ipc", "--uts", "--net", "--cgroup", "--root"} <= set(argv)
    assert argv[argv.index("setpriv"):][-3:] == ["/bin/sh", "-c", "echo hi"] and "--bounding-set=-all" in argv


def test_a_hub_that_is_not_root_enters_the_outer_user_namespace_first_then_the_others_then_the_inits():
    from hub.boxes.bwrap import enter_argv

    argv = enter_argv(4242, "echo hi", as_owner=True)
    first, second = argv.index("nsenter"), argv.index("nsenter", 1)
    assert argv[first:second][:3] == ["nsenter", "--preserve-credentials", "--user=/proc/self/fd/0"]
    assert {"--mount", "--pid", "--ipc", "--uts", "--net", "--cgroup", "--root"} <= set(argv[first:second])
    assert argv[second:argv.index("setpriv")] == ["nsenter", "--preserve-credentials", "-t", "1", "--user", "--"]
    assert argv[-1] == "echo hi" and "exec </dev/null" in argv[-3]  # the namespace's descriptor leaves stdin
