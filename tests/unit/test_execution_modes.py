"""Execution modes: which mode a run freezes, which runtime may take it, and what a linux-dac child is shown (pure)."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from hub.domain import isolation as m
from hub.domain.placement import unfit
from hub.runner import boundary as dac


def runtime(modes: list[str] | None, **unavailable: str) -> SimpleNamespace:
    caps = {"engines": ["claude", "scripted"], "platform": "linux", "workspace_writable": True,
            "isolation_unavailable": {k.replace("_", "-"): v for k, v in unavailable.items()}}
    if modes is not None:
        caps["isolation"] = modes
    return SimpleNamespace(name="r1", capabilities=caps, shared=True, principal_id="p0", status="online")


@pytest.mark.parametrize(("offers", "chosen"), [
    ([["linux-dac", "process"]], "linux-dac"),   # linux-dac wherever a runner can provide it
    ([["process"], ["linux-dac"]], "linux-dac"),
    ([["process"]], "process"),
    ([["userns", "process"]], "userns"),          # a runner that is not root: the rootless sandbox, not process
    ([["userns"], ["linux-dac"]], "linux-dac"),
    ([[]], "linux-dac"),                          # nothing offered: the strongest (admission refuses it, see below)
])
def test_an_omitted_mode_is_the_strongest_one_some_runtime_offers(offers, chosen):
    assert m.default_mode({"isolation": o} for o in offers) == chosen


def test_a_runner_from_before_modes_offers_process_and_an_old_snapshot_ran_as_process():
    assert m.offered({"engines": ["claude"]}) == ["process"]
    assert m.frozen_mode({"engine": "claude"}) == "process"


def test_the_in_process_scripted_engine_needs_no_boundary_but_its_subprocess_mode_does():
    assert not m.needs_boundary({"engine": "scripted", "subprocess": False})
    assert m.needs_boundary({"engine": "scripted", "subprocess": True})
    assert m.needs_boundary({"engine": "codex"})


def test_placement_never_puts_a_run_on_a_runtime_that_does_not_offer_its_frozen_mode_and_says_why():
    snap = {"engine": "claude", "isolation": "linux-dac"}
    why = unfit(snap, "p1", runtime([], linux_dac=m.NO_BWRAP))
    assert why is not None and "apt-get install bubblewrap" in why
    assert unfit(snap, "p1", runtime(["linux-dac"])) is None
    assert unfit({"engine": "scripted", "isolation": "linux-dac"}, "p1", runtime([])) is None


@pytest.mark.parametrize(("caps", "withdrawn"), [
    ({"in_hub_process": True}, "process"),
    ({"host": "h", "uid": 0}, "uid"),
    ({"host": "other", "uid": 0}, None),
    ({"host": "h", "uid": 1000}, None),
])
def test_process_mode_is_withdrawn_from_a_runner_that_shares_the_hubs_process_or_uid(caps, withdrawn):
    kept = m.admit_process({"isolation": ["linux-dac", "process"], **caps}, "h", 0, allow_on_hub=False)
    if withdrawn is None:
        assert kept["isolation"] == ["linux-dac", "process"]
    else:
        assert kept["isolation"] == ["linux-dac"]
        assert f"shares the hub's {withdrawn}" in kept["isolation_unavailable"]["process"]
    allowed = m.admit_process({"isolation": ["process"], **caps}, "h", 0, allow_on_hub=True)
    assert allowed["isolation"] == ["process"]  # the operator's explicit setting


def test_a_virtualenv_cli_reveals_its_venv_and_the_python_it_comes_from(tmp_path):
    python = tmp_path / "pythons" / "3.11" / "bin" / "python3"
    python.parent.mkdir(parents=True)
    python.write_text("")
    venv = tmp_path / "home" / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(f"home = {python.parent}\n")
    cli = venv / "bin" / "agent"
    cli.write_text(f"#!{venv}/bin/python\n")
    (venv / "bin" / "python").symlink_to(python)
    roots = dac.install_roots(cli, "", home=tmp_path / "home")
    assert roots == {venv, tmp_path / "pythons" / "3.11"}


def test_an_npm_cli_under_nvm_reveals_its_package_and_node_but_nothing_else_of_the_home(tmp_path):
    home = tmp_path / "home"
    prefix = home / ".nvm" / "versions" / "node" / "v20"
    package = prefix / "lib" / "node_modules" / "@anthropic-ai" / "claude-code"
    package.mkdir(parents=True)
    (package / "cli.js").write_text("#!/usr/bin/env node\n")
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "node").write_text("")
    (prefix / "bin" / "node").chmod(0o755)
    (prefix / "bin" / "claude").symlink_to(package / "cli.js")
    (home / ".ssh").mkdir()
    roots = dac.install_roots(prefix / "bin" / "claude", str(prefix / "bin"), home=home)
    assert roots == {package, prefix}
    assert all(home / ".ssh" != r and home != r for r in roots)


def test_a_cli_in_local_bin_reveals_its_own_folder_only_never_the_home(tmp_path):
    home = tmp_path / "home"
    (home / ".local" / "bin").mkdir(parents=True)
    cli = home / ".local" / "bin" / "pi"
    cli.write_text("")
    assert dac.install_roots(cli, "", home=home) == {home / ".local" / "bin"}


def test_the_boundary_binds_the_workspace_and_home_rw_the_reveals_ro_and_drops_to_the_uid(tmp_path):
    ws, home, tool = tmp_path / "ws" / "tr_1", tmp_path / "homes" / "uid-300000", tmp_path / "opt-tool"
    b = dac.Boundary(300000, ws, home, reveal=(tool,), hide=(tmp_path / "opt-tool" / "secret",), network="isolated",
                     bridge=tmp_path / "bridge", hub_port=8787)
    argv = dac.argv("/usr/bin/bwrap", b, ["/bin/agent", "-p"])
    joined = " ".join(argv)
    assert f"--bind {ws} {ws}" in joined and f"--bind {home} {home}" in joined
    assert f"--ro-bind {tool} {tool}" in joined
    assert "--unshare-net" in argv and "--unshare-pid" in argv and "--die-with-parent" in argv
    assert f"--ro-bind {tmp_path / 'bridge'} /run/amux" in joined
    drop = argv.index("setpriv")
    assert argv[drop:drop + 5] == ["setpriv", "--reuid", "300000", "--regid", "300000"]
    assert "--no-new-privs" in argv[drop:] and argv[-2:] == ["/bin/agent", "-p"]
    sized = [argv[argv.index("--tmpfs", i) + 1] for i in range(len(argv)) if argv[i] == "--size"]
    assert "/dev" in sized and "/dev/shm" in sized and "/tmp" in sized  # every tmpfs sized; not bwrap's --dev
    assert "--dev" not in argv
    assert "8787=/run/amux/hub.sock" in argv and f"{dac.PROXY_PORT}=/run/amux/proxy.sock" in argv


def test_an_isolated_child_reaches_the_hub_on_its_loopback_and_everything_else_through_the_proxy():
    b = dac.Boundary(300001, Path("/w"), Path("/h"), network="isolated", bridge=Path("/b"), hub_port=9,
                     extra_env={"AMUX_HUB_URL": "http://127.0.0.1:9"})
    env = dac.child_env(b, {"AMUX_HUB_URL": "http://10.0.0.5:9", "HOME": "/runner-home"})
    assert env["HOME"] == "/h" and env["AMUX_HUB_URL"] == "http://127.0.0.1:9"
    assert env["HTTPS_PROXY"] == f"http://127.0.0.1:{dac.PROXY_PORT}" and "127.0.0.1" in env["NO_PROXY"]


def test_a_userns_boundary_adds_a_user_namespace_drops_every_capability_and_never_switches_uid(tmp_path):
    ws, home = tmp_path / "ws" / "tr_1", tmp_path / "homes" / "principal-pr_1"
    b = dac.Boundary(None, ws, home, network="isolated", bridge=tmp_path / "bridge", hub_port=8787)
    argv = dac.argv("/usr/bin/bwrap", b, ["/bin/agent", "-p"], disable_userns=True)
    assert argv[1:6] == ["--unshare-user", "--disable-userns", "--cap-drop", "ALL", "--unshare-pid"]
    assert "setpriv" not in argv and "--unshare-net" in argv and argv[-2:] == ["/bin/agent", "-p"]
    joined = " ".join(argv)
    assert f"--bind {ws} {ws}" in joined and f"--bind {home} {home}" in joined
    assert "--disable-userns" not in dac.argv("/usr/bin/bwrap", b, ["/bin/agent"])  # a bubblewrap before 0.8


def test_a_userns_childs_init_cannot_bind_a_low_port_so_a_hub_on_one_is_reached_on_a_high_one():
    assert dac.inside_port(80, None) == 20080 and dac.inside_port(8787, None) == 8787
    assert dac.inside_port(80, 300000) == 80  # linux-dac's init is root inside: the hub's own port


def test_when_no_runtime_offers_any_mode_the_refusal_names_each_modes_reason_and_fix():
    text = m.no_mode_text("claude", [{"isolation": [], "isolation_unavailable": {
        "linux-dac": m.NOT_ROOT, "userns": m.NO_BWRAP, "process": m.NOT_DEDICATED}}])
    assert "engine claude" in text and "apt-get install bubblewrap" in text and "--dedicated" in text
    assert text.count("userns:") == 1


def test_the_launch_chain_of_a_script_names_its_interpreter_after_it(tmp_path):
    interp = tmp_path / "bin" / "node"
    interp.parent.mkdir()
    interp.write_text("")
    interp.chmod(0o755)
    cli = tmp_path / "cli.js"
    cli.write_text("#!/usr/bin/env node\n")
    assert dac.launch_chain(cli, str(interp.parent)) == [cli, interp]
