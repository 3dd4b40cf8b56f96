"""Settings: TOML file overlaid by AMUX_* variables with `__` between levels."""
from __future__ import annotations

import pytest

from hub.config import load_settings
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
