"""Settings: TOML file overlaid by AMUX_* variables with `__` between levels."""
from __future__ import annotations

import json

import pytest

from hub.config_sources import effective, load, load_settings
from hub.errors import Invalid


def test_environment_overrides_the_toml_file_with_double_underscore_levels(tmp_path):
    f = tmp_path / "amux.toml"
    f.write_text('listen = "0.0.0.0:9000"\n[hub]\nreservation_ttl_s = 10\n')
    s = load_settings(f, env={"AMUX_HUB__RESERVATION_TTL_S": "5", "AMUX_LEASES__TAKEOVER_QUIET_S": "60"})
    assert s.listen == "0.0.0.0:9000" and s.hub.reservation_ttl_s == 5 and s.leases.takeover_quiet_s == 60


def test_default_database_is_sqlite_in_amux_home(tmp_path):
    s = load_settings(env={"AMUX_HOME": str(tmp_path)})
    assert s.db_url() == f"sqlite+aiosqlite:///{tmp_path.resolve() / 'amux.db'}"


def test_a_missing_explicit_config_file_is_refused(tmp_path):
    with pytest.raises(Invalid, match="--config"):
        load_settings(tmp_path / "nope.toml", env={})


def test_a_bad_value_names_where_to_fix_it(tmp_path):
    with pytest.raises(Invalid, match="AMUX_"):
        load_settings(env={"AMUX_HOME": str(tmp_path), "AMUX_HUB__POLL_S": "often"})


def test_trusted_proxies_come_as_a_toml_list_or_a_comma_separated_variable_and_must_be_addresses(tmp_path):
    f = tmp_path / "amux.toml"
    f.write_text('[hub]\ntrusted_proxies = ["10.0.0.0/8"]\n')
    assert load_settings(f, env={}).hub.trusted_proxies == ["10.0.0.0/8"]
    s = load_settings(env={"AMUX_HOME": str(tmp_path), "AMUX_HUB__TRUSTED_PROXIES": "10.0.0.0/8, 192.0.2.7"})
    assert s.hub.trusted_proxies == ["10.0.0.0/8", "192.0.2.7"]
    with pytest.raises(Invalid, match="not an IP address or network"):
        load_settings(env={"AMUX_HOME": str(tmp_path), "AMUX_HUB__TRUSTED_PROXIES": "proxy.local"})


def test_the_edge_settings_default_to_the_documented_limits(tmp_path):
    s = load_settings(env={"AMUX_HOME": str(tmp_path)})
    assert (s.hub.max_pending_per_client, s.hub.max_connections_per_client) == (64, 256)
    assert s.hub.metrics_token is None and s.hub.metrics_listen is None
    assert (s.oauth.register_per_minute, s.oauth.unused_client_ttl_s) == (20, 86400)


# ---------------------------------------------------------------- strict keys

def test_an_unknown_key_in_the_toml_file_is_refused_naming_the_nearest_valid_one(tmp_path):
    f = tmp_path / "amux.toml"
    for text, wanted in (("[hub]\nreservaton_ttl_s = 5\n", "unknown key hub.reservaton_ttl_s; did you mean "
                                                           "hub.reservation_ttl_s?"),
                         ('listn = "0.0.0.0:1"\n', "did you mean listen?"),
                         ('[[feishu.apps]]\napp_id = "a"\napp_secrt = "s"\n', "did you mean feishu.apps[].app_secret?"),
                         ('[profiles.presets.claude]\nmodle = "m"\n', "profiles.presets.claude.modle"),
                         ("[nothing_like_it]\nx = 1\n", "unknown key nothing_like_it")):
        f.write_text(text)
        with pytest.raises(Invalid) as e:
            load_settings(f, env={})
        assert wanted in e.value.message and str(f) in e.value.message


def test_an_unknown_amux_variable_is_refused_naming_the_nearest_valid_one(tmp_path):
    for name, nearest in (("AMUX_HUB__RESERVATON_TTL_S", "AMUX_HUB__RESERVATION_TTL_S"),
                          ("AMUX_LISTN", "AMUX_LISTEN"), ("AMUX_LOG__FROMAT", "AMUX_LOG__FORMAT"),
                          ("AMUX_HUB__POLL_S__X", None), ("AMUX_SCHEDULE__POLL_S", "AMUX_SCHEDULES__POLL_S")):
        with pytest.raises(Invalid) as e:
            load_settings(env={"AMUX_HOME": str(tmp_path), name: "5"})
        assert f"unknown setting {name}" in e.value.message
        if nearest:
            assert f"did you mean {nearest}?" in e.value.message


def test_amux_variables_that_are_not_settings_never_stop_a_start(tmp_path):
    env = {"AMUX_HOME": str(tmp_path), "AMUX_TOKEN": "t", "AMUX_HUB_URL": "http://h", "AMUX_SESSION_ID": "s",
           "AMUX_TEST_DATABASE_URL": "x", "AMUX_CLAUDE_BIN": "c", "AMUX_CODEX_BIN": "c", "AMUX_PI_BIN": "p",
           "AMUX_SOAK_DURATION_S": "1", "AMUX_BENCH_PROFILE": "1", "AMUX_FUZZ_SEED": "1", "AMUX_PROPERTY_EXAMPLES": "1",
           "AMUX_RUNNER_TOKEN": "r", "AMUX_HTTP_PORT": "1", "AMUX_IMAGE": "i", "AMUX_BOX_ID": "b", "AMUX_EXEC_ID": "e"}
    assert load_settings(env=env).home == tmp_path


def test_log_settings_come_from_the_file_the_environment_or_the_older_amux_log_level(tmp_path):
    assert load_settings(env={"AMUX_HOME": str(tmp_path)}).log.model_dump() == {"format": "text", "level": "WARNING",
                                                                               "access": True}
    s = load_settings(env={"AMUX_HOME": str(tmp_path), "AMUX_LOG__FORMAT": "json", "AMUX_LOG_LEVEL": "info"})
    assert (s.log.format, s.log.level) == ("json", "INFO")
    s = load_settings(env={"AMUX_HOME": str(tmp_path), "AMUX_LOG__LEVEL": "error", "AMUX_LOG_LEVEL": "debug"})
    assert s.log.level == "ERROR"  # the new spelling wins
    with pytest.raises(Invalid, match="AMUX_LOG__FORMAT"):
        load_settings(env={"AMUX_HOME": str(tmp_path), "AMUX_LOG__FORMAT": "xml"})


def test_feishu_apps_come_from_a_json_variable_or_a_file_it_names(tmp_path):
    apps = [{"app_id": "cli_env", "app_secret": "s", "admin_open_id": "ou_1"}]
    s = load_settings(env={"AMUX_HOME": str(tmp_path), "AMUX_FEISHU__APPS": json.dumps(apps)})
    assert [(a.app_id, a.admin_open_id, a.mode) for a in s.feishu.apps] == [("cli_env", "ou_1", "webhook")]
    toml_file = tmp_path / "apps.toml"
    toml_file.write_text('[[apps]]\napp_id = "cli_t"\napp_secret = "s"\nmode = "long-connection"\n')
    json_file = tmp_path / "apps.json"
    json_file.write_text(json.dumps({"apps": apps}))
    for path, app_id in ((toml_file, "cli_t"), (json_file, "cli_env")):
        s = load_settings(env={"AMUX_HOME": str(tmp_path), "AMUX_FEISHU__APPS_FILE": str(path)})
        assert [a.app_id for a in s.feishu.apps] == [app_id]
    with pytest.raises(Invalid, match="both set"):
        load_settings(env={"AMUX_HOME": str(tmp_path), "AMUX_FEISHU__APPS": json.dumps(apps),
                           "AMUX_FEISHU__APPS_FILE": str(toml_file)})
    with pytest.raises(Invalid, match="app_secrt"):
        load_settings(env={"AMUX_HOME": str(tmp_path), "AMUX_FEISHU__APPS": '[{"app_id": "a", "app_secrt": "s"}]'})
    with pytest.raises(Invalid, match="AMUX_"):
        load_settings(env={"AMUX_HOME": str(tmp_path), "AMUX_FEISHU__APPS": "[not json"})


def test_precedence_is_flags_then_environment_then_file_and_each_source_is_known(tmp_path):
    f = tmp_path / "amux.toml"
    f.write_text('listen = "0.0.0.0:1"\ndatabase_url = "sqlite+aiosqlite:///file.db"\n[hub]\npoll_s = 1\n'
                 'heartbeat_s = 3\n')
    loaded = load(f, {"AMUX_HUB__POLL_S": "2", "AMUX_DATABASE_URL": "sqlite+aiosqlite:///env.db"},
                  {"database_url": "postgresql://u:pw@h/db", "listen": None})
    s = loaded.settings
    assert (s.listen, s.hub.poll_s, s.hub.heartbeat_s, s.database_url) == ("0.0.0.0:1", 2, 3, "postgresql://u:pw@h/db")
    rows = {k: (v, src) for k, v, src in effective(loaded)}
    assert rows["listen"] == ("0.0.0.0:1", f"file {f}") and rows["hub.poll_s"] == (2.0, "env AMUX_HUB__POLL_S")
    assert rows["database_url"] == ("postgresql://u:***@h/db", "flag") and rows["hub.deadline_grace_s"][1] == "default"


def test_the_stall_notice_defaults_to_300_s_and_a_negative_one_is_refused_naming_the_setting(tmp_path):
    assert load_settings(env={"AMUX_HOME": str(tmp_path)}).runner.stall_notice_s == 300
    with pytest.raises(Invalid, match="AMUX_RUNNER__STALL_NOTICE_S"):
        load_settings(env={"AMUX_HOME": str(tmp_path), "AMUX_RUNNER__STALL_NOTICE_S": "-1"})


def test_amux_runner_refuses_a_stall_notice_that_is_not_seconds_naming_an_example(capsys):
    from hub.cli import build_parser

    assert build_parser().parse_args(["runner", "--stall-notice-s", "0"]).stall_notice_s == 0
    with pytest.raises(SystemExit):
        build_parser().parse_args(["runner", "--stall-notice-s", "five"])
    assert "pass e.g. 300, or 0 to turn it off" in capsys.readouterr().err
