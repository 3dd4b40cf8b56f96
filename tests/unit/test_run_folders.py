"""A run's folders: changed-file evidence and the removal of a plain task's own HOME."""
from __future__ import annotations

import asyncio

from hub.runner.agent import diff_trees, remove_tree, snapshot_tree, tree_of


def test_an_empty_or_missing_workspace_has_no_files(tmp_path):
    assert asyncio.run(tree_of(tmp_path)) == {}
    assert asyncio.run(tree_of(tmp_path / "missing")) == {}


def test_a_workspace_tree_lists_every_file_below_it_as_snapshot_tree_does(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "b.txt").write_text("x")
    (tmp_path / "c.txt").write_text("yy")
    tree = asyncio.run(tree_of(tmp_path))
    assert tree == snapshot_tree(tmp_path)
    assert sorted(tree) == ["a/b.txt", "c.txt"]
    assert diff_trees({}, tree)["created"] == ["a/b.txt", "c.txt"]


def test_a_plain_tasks_home_is_removed_at_its_end_whether_empty_or_not(tmp_path):
    empty, full = tmp_path / "empty", tmp_path / "full"
    empty.mkdir()
    (full / ".config" / "x").mkdir(parents=True)
    (full / ".config" / "x" / "state.json").write_text("{}")
    asyncio.run(remove_tree(empty))
    asyncio.run(remove_tree(full))
    asyncio.run(remove_tree(tmp_path / "never-made"))  # nothing to remove is no error
    assert not empty.exists() and not full.exists()
