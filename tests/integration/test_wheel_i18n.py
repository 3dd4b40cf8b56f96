"""Packaging: the wheel carries the compiled catalogs, so an installed hub renders Chinese.

Builds the wheel from a copy of the source the way `pip install .` does (in build isolation, unless the
project venv can build wheels itself: then with its setuptools, no downloads), installs it with `--no-deps` into a
fresh venv outside the source tree whose only other import path is the project venv's third-party packages, and
renders the overview card there.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

from tests.helpers import REPO

RENDER = r"""
import json, sys, bot
from bot.cards.overview import render_overview
from bot.cards.views import OverviewView, Outcome
from bot.i18n import Catalogs
card = render_overview(OverviewView(viewer="alice", total=3, failing=1, paused=1,
                       latest=(Outcome("nightly", "2026-01-05T09:00:00+00:00", "failed"),), is_admin=False), Catalogs())
print(json.dumps({"bot": bot.__file__, "title": card["header"]["title"]["i18n_content"]}, ensure_ascii=False))
"""


def _copy_source(dst: Path) -> None:
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, dst / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for pkg in ("hub", "bot", "migrations"):
        shutil.copytree(REPO / pkg, dst / pkg, ignore=ignore)
    for po in (dst / "bot" / "locales").glob("*/LC_MESSAGES/*.po"):
        po.unlink()  # prove the wheel does not need the sources of translations


def test_installed_wheel_renders_the_overview_in_chinese(tmp_path: Path):
    src, wheels, venv, elsewhere = (tmp_path / n for n in ("src", "wheels", "venv", "elsewhere"))
    for d in (src, wheels, elsewhere):
        d.mkdir()
    _copy_source(src)
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("wheel") else []
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q", "-w", str(wheels),
                            str(src)], capture_output=True, text=True, cwd=elsewhere)
    assert build.returncode == 0, build.stderr[-3000:]
    wheel = next(wheels.glob("amux_hub-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "bot/locales/zh_Hans/LC_MESSAGES/messages.mo" in names, names

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    # Third-party dependencies come from the project venv (a plain path entry: its editable-install hook
    # for this repository is a .pth file, which is not processed from a plain path).
    (site / "zz_project_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # Without PYTHONPATH: a source tree on it (with its egg-info) reads as "already installed" and pip skips the wheel.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)],
                   check=True, capture_output=True, cwd=elsewhere, env=env)

    out = subprocess.run([str(py), "-c", RENDER], check=True, capture_output=True, text=True, cwd=elsewhere, env=env)
    res = json.loads(out.stdout)
    assert Path(res["bot"]).is_relative_to(venv), f"imported bot from {res['bot']}, not the installed wheel"
    assert res["title"] == {"en_us": "amux overview", "zh_cn": "amux 概览"}
