"""The house's import rule, checked on the source (docs/architecture.md): imports flow down only, workloads never
import each other, no module imports itself through others (in-function imports counted), and an import inside
a function is allowed only in the modules LAZY lists, each with its reason (a login node must not import torch,
or a heavy or optional dependency is imported only where it is used)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
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


LOGIN = "login node: submit, status, sync, report and `import hpctrain` import no torch; the verb's work is imported when it runs"
REGISTRATION = (
    "registration: every command (login nodes too) imports each workload's verbs.py; a verb's work (torch, the "
    "readers) is imported when it runs"
)
# The one place that allows an import inside a function: module -> why it cannot import at the top.
LAZY = {
    "hpctrain": LOGIN + " (hpctrain.load imports workloads.trained, torch, when called)",
    "hpctrain.cli": "stop handlers first: `hpctrain train` installs them after this module's imports, so the "
    "error line's masking and importlib.metadata (the version) come in only when they are used",
    "hpctrain.commands.export": "--out first: a taken folder is one line in a second, before torch and the "
    "checkpoint load",
    "hpctrain.commands.model_verb": "first line before torch: sample and evaluate say they are at work before "
    "the checkpoint reader (torch) loads",
    "hpctrain.commands.report": LOGIN,
    "hpctrain.commands.submit": LOGIN,
    "hpctrain.commands.sync": LOGIN + " (wandb: only when syncing)",
    "hpctrain.launch.submitit_launcher": LOGIN
    + " (submitit's job side and the engine run on the compute node)",
    "hpctrain.runtime.seeding": "heavy import: torch only where its RNG state is seeded, read or set (the data "
    "verbs use numpy_rng alone)",
    "hpctrain.remote.auth": "heavy import: aiohttp/pelicanfs only for pelican:// URIs",
    "hpctrain.remote.failures": "heavy import: aiohttp/aiowebdav2/pelicanfs only for remote URIs",
    "hpctrain.remote.files": "heavy import: pelicanfs only for pelican:// URIs",
    "hpctrain.remote.oidc": "heavy import: authlib/requests only when a token is fetched",
    "hpctrain.remote.pelican_write": "heavy import: requests only when a checkpoint is uploaded",
    "hpctrain.track.build": "heavy import: tensorboard/wandb only when that tracker is on",
    "hpctrain.track.monitor": "heavy import: psutil/pynvml only when the monitor samples",
    "hpctrain.track.report.compare": "heavy dependency: matplotlib/jinja2 only when a figure or page is drawn",
    "hpctrain.track.report.page": "heavy dependency: jinja2 only when a page is drawn",
    "hpctrain.track.report.panels": "heavy dependency: matplotlib only when a figure is drawn",
    "hpctrain.track.sync": "heavy import: wandb only when syncing",
    "hpctrain.track.tensorboard": "heavy import: tensorboard only when that tracker is on",
    "hpctrain.track.wandb_tracker": "heavy import: wandb only when that tracker is on",
    "hpctrain.train.entry": "stop handlers before torch: the submitit job calls run() with no torch imported, so a "
    "USR1 during torch's slow import is a requeue; the trainer and first_update (torch) come after them (the "
    "process group is left only where dist was loaded)",
    "hpctrain.train.exported": "export's --out check imports no torch: torch only where a network is written "
    "(state_bytes) or read (the tensor reader)",
    "hpctrain.train.checkpoint": "locate says a run or step that is not there before torch: sample, evaluate and "
    "export end in a second on a mistyped folder; torch (the writer, the tensor reader, the run lock's dist) "
    "where a file is written or read",
    "hpctrain.train.compile.stats": "heavy import: torch._dynamo (seconds) only when a model is compiled",
    "hpctrain.train.profile": "torch.profiler only when train.profile is on",
    "hpctrain.train.what_ran": "heavy import: pynvml only where a GPU is used",
    "hpctrain.workloads.fields.dataset": "heavy import: h5py only for HDF5 shards",
    "hpctrain.workloads.fields.generate": "heavy import: h5py only for HDF5 shards",
    "hpctrain.workloads.fields.verbs": REGISTRATION,
    "hpctrain.workloads.muons.evaluation.two_sample": "heavy dependency: scikit-learn only when the judge runs",
    "hpctrain.workloads.muons.evaluation.quality": "heavy dependency: scipy (0.5 s) only when primaries are matched, "
    "not in every process that loads a muon model (hpctrain sample)",
    "hpctrain.workloads.muons.evaluation.quality_report": "heavy dependency: matplotlib only when a figure is drawn",
    "hpctrain.workloads.muons.report": "heavy dependency: matplotlib only when a figure is drawn",
    "hpctrain.workloads.muons.events.layouts": "heavy import: h5py only for HDF5 files",
    "hpctrain.workloads.muons.events.remote_index": "heavy import: h5py only for HDF5 files",
    "hpctrain.workloads.muons.truth.versions": "heavy import: h5py/pyarrow only when a file's version is read",
    "hpctrain.workloads.muons.verbs": REGISTRATION,
    "hpctrain.workloads.registry": "the report's types, and NumPy with them, only where a report is drawn: the "
    "login-node verbs resolve their config through this module",
    "hpctrain.workloads.regression.verbs": REGISTRATION,
}
# Circles left, each with its reason (none now); none may be added.
KNOWN_CIRCLES: dict[frozenset[str], str] = {}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in SRC.rglob("*.py")}


def _statements(
    node: ast.AST, in_function: bool = False
) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import below `node` that runs (those under `if TYPE_CHECKING:` never do), and whether it is inside a
    function."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            for other in child.orelse:
                yield from _statements(other, in_function)
            continue
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, in_function
        yield from _statements(
            child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
        )


def _targets(module: str, stmt: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules `stmt` (in `module`) imports: `from a import b` names module a.b where there is one."""
    if isinstance(stmt, ast.Import):
        return [alias.name for alias in stmt.names]
    base = stmt.module or ""
    if stmt.level:
        package = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
        package = package[: len(package) - stmt.level + 1]
        base = ".".join(package + ([stmt.module] if stmt.module else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in stmt.names]


def _known(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> tuple[dict[str, set[str]], dict[str, list[str]]]:
    """(module -> the hpctrain modules it imports, module -> what it imports inside functions)."""
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    lazy: dict[str, list[str]] = {}
    for module, path in MODULES.items():
        for stmt, in_function in _statements(ast.parse(path.read_text())):
            for target in _targets(module, stmt):
                if in_function:
                    lazy.setdefault(module, []).append(f"line {stmt.lineno}: {target}")
                found = _known(target) if target.split(".")[0] == "hpctrain" else None
                if found is not None and found != module:
                    edges[module].add(found)
    return edges, lazy


def circles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected parts of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in edges[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            part = []
            while True:
                top = stack.pop()
                part.append(top)
                if top == node:
                    break
            if len(part) > 1:
                found.append(frozenset(part))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_import_circles_counting_imports_inside_functions() -> None:
    edges, _ = import_graph()
    new = [sorted(part) for part in circles(edges) if part not in KNOWN_CIRCLES]
    assert not new, f"import circles (move the shared piece down, into a module both import): {new}"


def test_imports_inside_functions_only_where_listed_with_a_reason() -> None:
    _, lazy = import_graph()
    unlisted = {m: found for m, found in lazy.items() if m not in LAZY}
    assert not unlisted, (
        f"imports inside functions: import at the top, or add the module to LAZY with why: {unlisted}"
    )
    stale = sorted(set(LAZY) - set(lazy))
    assert not stale, f"LAZY lists modules that no longer import inside a function: {stale}"


def test_the_graph_sees_lazy_imports_and_circles() -> None:
    """The checker itself: a function-level import makes an edge, and two modules importing each other are a circle."""
    edges, lazy = import_graph()
    assert "hpctrain.workloads.muons.tasks.wgan" in edges["hpctrain.workloads.muons.verbs"]
    assert any("hpctrain.workloads.trained" in line for line in lazy["hpctrain"])
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset({"a", "b", "c"})]


def test_registration_imports_no_torch_at_module_level() -> None:
    """What every command imports (each workload's spec.py and verbs.py, and the registry) reaches no torch
    through top-level imports; nor do the muon data verbs (`hpctrain data generate|inspect --kind muons`: NumPy
    and Arrow only, and torch's import costs seconds of each call)."""
    heavy = []
    for top in [
        *(m for m in MODULES if m.endswith((".spec", ".verbs")) and m.startswith("hpctrain.workloads.")),
        "hpctrain.workloads.muons.data_verbs",
    ]:
        seen, todo = set(), [top]
        while todo:
            module = todo.pop()
            if module in seen:
                continue
            seen.add(module)
            for stmt, in_function in _statements(ast.parse(MODULES[module].read_text())):
                if in_function:
                    continue
                for target in _targets(module, stmt):
                    if target.split(".")[0] == "torch":
                        heavy.append(f"{top} reaches torch through {module}")
                    found = _known(target) if target.split(".")[0] == "hpctrain" else None
                    if found is not None:
                        todo.append(found)
    assert not heavy, heavy


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
