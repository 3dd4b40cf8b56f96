"""Box uids: claimed on the host, one file each, so no two live boxes of a machine ever share one."""
from __future__ import annotations

import multiprocessing
import os
import subprocess
import time
from pathlib import Path

import pytest

from hub.boxes.base import BoxError
from hub.boxes.uids import UidClaims


def _claim_many(directory: str, prefix: str, n: int) -> list[int]:
    claims = UidClaims(Path(directory), base=1000, span=200)
    return [claims.claim(f"vm_{prefix}{i}") for i in range(n)]


def test_hubs_claiming_at_once_in_separate_processes_never_get_the_same_uid(tmp_path):
    with multiprocessing.get_context("fork").Pool(4) as pool:
        got = pool.starmap(_claim_many, [(str(tmp_path), p, 40) for p in "abcd"])
    every = [uid for uids in got for uid in uids]
    assert len(every) == 160 and len(set(every)) == 160
    assert len(UidClaims(tmp_path, base=1000, span=200).held()) == 160


def test_the_lowest_free_uid_is_claimed_and_a_released_one_is_claimed_again(tmp_path):
    claims = UidClaims(tmp_path, base=1000, span=3)
    assert [claims.claim(b) for b in ("vm_a", "vm_b", "vm_c")] == [1000, 1001, 1002]
    claims.release("vm_b", 1001)
    assert claims.claim("vm_d") == 1001


def test_a_full_range_is_refused_naming_the_tool_that_frees_a_uid(tmp_path):
    claims = UidClaims(tmp_path, base=1000, span=1)
    claims.claim("vm_a")
    with pytest.raises(BoxError, match="`rift_vm_destroy`"):
        claims.claim("vm_b")


def test_releasing_never_frees_another_boxs_uid_and_without_the_uid_finds_the_boxs_own(tmp_path):
    claims = UidClaims(tmp_path, base=1000, span=5)
    a, b = claims.claim("vm_a"), claims.claim("vm_b")
    claims.release("vm_a", b)           # a stale handle naming a uid now held by another box
    claims.release("vm_gone")           # a box that never got one
    assert claims.held() == {a: "vm_a", b: "vm_b"}
    claims.release("vm_a")              # a provisional handle: no uid recorded, found by the box id
    assert claims.held() == {b: "vm_b"}


@pytest.mark.skipif(os.geteuid() != 0, reason="starting a process as another uid needs root")
def test_a_uid_some_process_runs_as_is_not_free_even_unclaimed(tmp_path):
    proc = subprocess.Popen(["setpriv", "--reuid=300500", "--regid=300500", "--clear-groups", "sleep", "30"])
    try:
        deadline = time.monotonic() + 5
        while os.stat(f"/proc/{proc.pid}").st_uid != 300500 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert UidClaims(tmp_path, base=300500, span=2).claim("vm_a") == 300501
    finally:
        proc.kill()
        proc.wait()
