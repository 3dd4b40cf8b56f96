"""The Makefile's two commands: `make run` installs the runtime dependencies only, `make test` adds the test extras."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.skipif(not shutil.which("make"), reason="make is missing")


def _dry_run(target: str, tmp_path) -> list[str]:
    """Return the pip install lines `make -n TARGET` would run in a fresh copy (no venv, no stamps)."""
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(REPO / name, tmp_path / name)
    out = subprocess.run(["make", "-n", target], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    return [ln for ln in out.splitlines() if re.search(r"pip install .*-e ", ln)]


def test_make_run_installs_the_package_without_its_test_extras(tmp_path):
    lines = _dry_run("run", tmp_path)
    assert lines and all("[test]" not in ln for ln in lines), lines


def test_make_test_adds_the_test_extras_after_the_runtime_install(tmp_path):
    rule = re.search(r"^test:(.*)$", (REPO / "Makefile").read_text(), re.M)
    assert rule and "venv-test" in rule.group(1).split()
    lines = _dry_run("venv-test", tmp_path)
    assert "[test]" not in lines[0] and "'.[test]'" in lines[-1], lines


def test_a_venv_made_by_make_run_gets_the_extras_at_make_test_and_make_run_then_installs_nothing(tmp_path):
    _dry_run("run", tmp_path)
    venv = tmp_path / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(shutil.which("python3"))
    (venv / ".installed").touch()  # as `make run` leaves it
    out = subprocess.run(["make", "-n", "venv-test"], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    installs = [ln for ln in out.splitlines() if "pip install" in ln]
    assert len(installs) == 1 and "'.[test]'" in installs[0], installs
    (venv / ".installed-test").touch()
    out = subprocess.run(["make", "-n", "run"], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert "pip install" not in out, out
