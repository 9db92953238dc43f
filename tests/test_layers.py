"""The house's import rule, checked on the source (docs/architecture.md): imports flow down only, workloads never
import each other, and the verbs of a login node (submit, status, sync, report) import no torch."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SRC = ROOT / "src" / "hpctrain"
# Higher imports lower (or its own level), never the other way.
LEVEL = {
    "cli": 6,
    "__main__": 6,
    "commands": 5,
    "workloads": 4,
    "train": 3,
    "launch": 3,
    "data": 3,
    "track": 2,
    "remote": 2,
    "config": 1,
    "runtime": 1,
    "errors": 0,
    "fsutil": 0,
}


def _imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
    return [m for m in found if m == "hpctrain" or m.startswith("hpctrain.")]


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "hpctrain"


def test_every_module_belongs_to_a_level() -> None:
    tops = {
        p.stem for p in SRC.iterdir() if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists())
    }
    assert tops - {"__init__"} <= set(LEVEL), tops - set(LEVEL)


def test_imports_flow_down_only() -> None:
    upward = []
    for path in SRC.rglob("*.py"):
        here = path.relative_to(SRC).parts[0].removesuffix(".py")
        if here == "__init__":
            continue
        for module in _imports(path):
            there = _part(module)
            if there != "hpctrain" and LEVEL[there] > LEVEL[here]:
                upward.append(f"{path.relative_to(SRC)} imports {module}")
    assert not upward, upward


def test_workloads_never_import_each_other() -> None:
    crossing = []
    for path in (SRC / "workloads").rglob("*.py"):
        parts = path.relative_to(SRC / "workloads").parts
        if len(parts) < 2:
            continue  # registry.py hands them all over
        for module in _imports(path):
            other = module.split(".")
            if len(other) > 2 and other[1] == "workloads" and other[2] not in (parts[0], "registry"):
                crossing.append(f"{path.relative_to(SRC)} imports {module}")
    assert not crossing, crossing


def test_the_engine_names_no_workload() -> None:
    named = [
        f"{path.relative_to(SRC)} imports {module}"
        for folder in ("train", "launch", "data", "track", "remote", "runtime", "config")
        for path in (SRC / folder).rglob("*.py")
        for module in _imports(path)
        if module.startswith("hpctrain.workloads")
    ]
    assert not named, named


def test_architecture_doc_names_every_module() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    missing = [
        str(p.relative_to(SRC))
        for p in SRC.rglob("*.py")
        if p.name != "__main__.py"
        and not (p.name == "__init__.py" and p.stat().st_size < 60)
        and f"`{p.relative_to(SRC)}`" not in text
    ]
    assert not missing, (
        f"docs/architecture.md lacks {missing}: run `python tests/test_layers.py` to list them"
    )


def module_table() -> str:
    """One line per module: its path, length and the first line of its docstring."""
    rows = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "__main__.py" or (path.name == "__init__.py" and path.stat().st_size < 60):
            continue
        text = path.read_text()
        first = (ast.get_docstring(ast.parse(text)) or "").strip().split("\n")[0].rstrip(".")
        if len(first) > 105:
            first = first[:102].rsplit(" ", 1)[0] + " ..."
        rows.append(f"| `{path.relative_to(SRC)}` | {len(text.splitlines())} | {first} |")
    return "| module | lines | what it is |\n|---|---:|---|\n" + "\n".join(rows) + "\n"


if __name__ == "__main__":  # rewrite the module list of docs/architecture.md (everything after "## Modules")
    doc = ROOT / "docs" / "architecture.md"
    head = doc.read_text().split("## Modules")[0]
    doc.write_text(head + "## Modules\n\n" + module_table())
