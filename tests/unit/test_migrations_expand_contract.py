"""Every migration is expand-only, so a replica of the previous release keeps working on the new schema during a
rolling update (docs/deploy.md, "Upgrades").

An `upgrade()` may add tables, nullable columns, columns with a server default, and indexes. It may not drop or
rename a table or column, make a column NOT NULL without a server default, add a NOT NULL column without one,
or drop a constraint: those are the *contract* half, which ships one release later, once no replica of the
release that still uses the old shape can be running. A contract step that is safe anyway says why on its own
line or the line above: `# contract-ok: <reason>`.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

VERSIONS = Path(__file__).resolve().parents[2] / "migrations" / "versions"
DROPS = {"drop_column", "drop_table", "rename_table", "drop_constraint", "drop_table_comment"}
MARK = "contract-ok:"

# Revisions that shipped before this rule existed (before deploy/ and the first multi-replica release); each says why
# it is safe. Nothing may be added here: new contract steps use `# contract-ok:` and a later release.
GRANDFATHERED: dict[tuple[str, int], str] = {}


def _kw(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is_false(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


def _column_not_null_without_default(col: ast.expr) -> bool:
    if not (isinstance(col, ast.Call) and getattr(col.func, "attr", getattr(col.func, "id", "")) == "Column"):
        return False
    return _is_false(_kw(col, "nullable")) and _kw(col, "server_default") is None and _kw(col, "primary_key") is None


def violations(source: str) -> list[tuple[int, str]]:
    """Return (line, what) for every contract step in `upgrade()` not marked `# contract-ok:`."""
    tree = ast.parse(source)
    lines = source.splitlines()
    upgrade = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "upgrade"), None)
    if upgrade is None:
        return []
    found = []
    for node in ast.walk(upgrade):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        name = node.func.attr
        what = None
        if name in DROPS:
            what = name
        elif name == "alter_column":
            if _kw(node, "new_column_name") is not None:
                what = "alter_column(new_column_name=...) renames a column"
            elif _is_false(_kw(node, "nullable")) and _kw(node, "server_default") is None:
                what = "alter_column(nullable=False) without server_default"
        elif name == "add_column":
            cols = ([a for a in node.args if isinstance(a, ast.Call)]
                    + [k.value for k in node.keywords if k.arg == "column"])
            if any(_column_not_null_without_default(c) for c in cols):
                what = "add_column of a NOT NULL column without server_default"
        elif (name == "execute" and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            sql = node.args[0].value.upper()
            if any(w in sql for w in ("DROP TABLE", "DROP COLUMN", "RENAME ", "SET NOT NULL")):
                what = f"execute({sql.split()[0]} ...): a contract step in raw SQL"
        if what is None:
            continue
        span = lines[node.lineno - 2: (node.end_lineno or node.lineno)]
        if any(MARK in line for line in span):
            continue
        found.append((node.lineno, what))
    return found


FILES = sorted(p for p in VERSIONS.glob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_every_migration_upgrade_is_expand_only(path: Path):
    bad = [(line, what) for line, what in violations(path.read_text())
           if (path.stem, line) not in GRANDFATHERED]
    assert not bad, (f"{path.name}: contract steps in upgrade() break a rolling update (the previous release's "
                     f"replicas still use the old shape): {bad}. Ship the drop in a later release, or mark a safe one "
                     f"with '# contract-ok: <reason>'.")


# One commented case per rule (the checker itself).
CASES = [
    ("def upgrade():\n    op.create_table('t', sa.Column('id', sa.String, primary_key=True))\n", []),  # expand
    ("def upgrade():\n    op.add_column('t', sa.Column('c', sa.String))\n", []),  # nullable column
    ("def upgrade():\n    op.add_column('t', sa.Column('c', sa.Integer, nullable=False, server_default='0'))\n", []),
    # old code can't insert
    ("def upgrade():\n    op.add_column('t', sa.Column('c', sa.Integer, nullable=False))\n", [2]),
    ("def upgrade():\n    op.drop_column('t', 'c')\n", [2]),  # old code still reads it
    ("def upgrade():\n    op.drop_table('t')\n", [2]),
    ("def upgrade():\n    op.alter_column('t', 'c', new_column_name='d')\n", [2]),  # a rename is a drop for old code
    ("def upgrade():\n    op.alter_column('t', 'c', nullable=False)\n", [2]),  # old code inserts NULL
    ("def upgrade():\n    with op.batch_alter_table('t') as b:\n        b.drop_column('c')\n", [3]),  # batch mode too
    ("def upgrade():\n    op.execute('ALTER TABLE t DROP COLUMN c')\n", [2]),  # raw SQL too
    ("def upgrade():\n    # contract-ok: c was never read by any release\n    op.drop_column('t', 'c')\n", []),
    ("def downgrade():\n    op.drop_table('t')\n", []),  # downgrades may contract
]


@pytest.mark.parametrize("source,lines", CASES)
def test_the_checker_flags_contract_steps_and_nothing_else(source: str, lines: list[int]):
    assert [line for line, _ in violations(source)] == lines
