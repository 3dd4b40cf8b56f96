"""Resource limits of a task child (pure): sizes, the lowest of runner, profile and request, what a person reads."""
from __future__ import annotations

import hashlib
import json

import pytest

from hub.domain.limits import Limits, applied_limits, limits_text, memory_reached, parse_size, pids_reached
from hub.domain.manifest import parse_manifest
from hub.errors import Invalid


@pytest.mark.parametrize(("text", "size"), [("4GiB", 4 << 30), ("512MiB", 512 << 20), ("1.5G", 3 << 29),
                                            ("2GB", 2 * 1000 ** 3), (268435456, 256 << 20)])
def test_a_memory_limit_is_written_with_a_unit_or_in_bytes(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["lots", "4 parsecs", "1MiB", True, "-1GiB"])
def test_a_bad_memory_limit_is_refused_naming_how_to_write_one(bad):
    with pytest.raises(Invalid) as refused:
        parse_size(bad)
    assert "e.g." in str(refused.value)


def test_each_limit_is_the_lowest_of_what_the_runner_the_profile_and_the_request_set():
    runner = Limits(4 << 30, 1024, 1.0)
    profile = Limits.parse({"memory_max": "2GiB"})
    request = Limits.parse({"pids_max": 128, "memory_max": "8GiB"})
    assert runner.lowest(profile.lowest(request)) == Limits(2 << 30, 128, 1.0)


@pytest.mark.parametrize("bad", [{"pids_max": 0}, {"pids_max": "many"}, {"cpu_max": 0}, {"swap_max": 1},
                                 {"memory_max": "huge"}])
def test_bad_limits_are_refused_naming_the_field(bad):
    with pytest.raises(Invalid) as refused:
        Limits.parse(bad)
    assert "limits" in str(refused.value)


def test_the_view_shows_nothing_for_a_run_without_a_child_or_a_runtime_that_offers_no_limits():
    assert applied_limits({"isolation": None}, {"limits": {"pids_max": 8}}) is None
    assert applied_limits({"isolation": "process"}, {}) is None


def test_what_a_person_reads_names_the_limit():
    assert memory_reached(256 << 20).startswith("memory limit 256 MiB reached")
    assert pids_reached(128).startswith("process limit 128 reached")
    assert limits_text({"memory_max": 4 << 30, "pids_max": 1024, "cpu_max": 1.5, "mechanism": {"pids": "cgroup-v1"}}) \
        == "memory 4 GiB, 1024 processes, 1.5 CPUs (pids: cgroup-v1)"


def test_a_profile_may_set_limits_and_one_without_keeps_its_digest():
    base = '{"manifest_version": 2, "name": "p", "engine": "claude"}'
    limited = '{"manifest_version": 2, "name": "p", "engine": "claude", "limits": {"memory_max": "2GiB"}}'
    assert parse_manifest(limited).limits is not None
    assert parse_manifest(base).digest() != parse_manifest(limited).digest()
    before = json.dumps(parse_manifest(base).model_dump(exclude={"limits"}), sort_keys=True).encode()
    assert parse_manifest(base).digest() == "sha256:" + hashlib.sha256(before).hexdigest()[:32]


def test_a_profile_with_a_bad_memory_limit_is_refused_when_it_is_added():
    with pytest.raises(Invalid) as refused:
        parse_manifest('{"manifest_version": 2, "name": "p", "engine": "claude", "limits": {"memory_max": "lots"}}')
    assert "memory_max" in str(refused.value)
