"""The house's limits (CONTRIBUTING.md, "Layout" and "Rules"), checked on the source tree.

- core/ and train/: no module over 600 lines, no function over 80 lines.
- No module imports a heavy library (torch, transformers, ...) when it is imported.
- No module imports another module's private name (`from trainfit.x import _helper`): a shared
  helper is a public name of the lower module.
- No import circle runs through a package's own `__init__` (the `no-circles` contract of
  `make lint` checks the circles among a package's modules; this is the one it cannot see).

The layers and the other circles are import-linter contracts in pyproject.toml (`make lint`).
The allow-lists below name today's offenders with their size now: an offender may shrink but not
grow, and one that is back within the limits (or gone) must leave its list, so the lists only
shrink until they are empty.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "trainfit"
LIMITED = ("core", "train")  # the folders the size limits hold for
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80

# Modules over MAX_MODULE_LINES (path -> lines): none; a module that grows past it is split, not listed.
MODULES_OVER: dict[str, int] = {}

# Functions over MAX_FUNCTION_LINES ("module::Class.function" -> lines): none, as above.
FUNCTIONS_OVER: dict[str, int] = {}

# Private names imported from another module (importer, "module::name"): none; share a public name.
PRIVATE_IMPORTS: set[tuple[str, str]] = set()

# Imported inside the functions that need them, never at module import time (the `train` and
# `report` extras; `trainfit analyze` and the planner run without them).
HEAVY = {"torch", "transformers", "peft", "trl", "deepspeed", "accelerate", "datasets", "safetensors",
         "tokenizers", "bitsandbytes", "matplotlib", "pyarrow"}
# train/'s callbacks subclass transformers.TrainerCallback, which needs the class when the module runs.
HEAVY_AT_IMPORT_ALLOWED = {("train", "transformers", "TrainerCallback")}


def _modules(folders=LIMITED):
    for folder in folders:
        yield from sorted((PACKAGE / folder).rglob("*.py"))


def _name(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _functions(node: ast.AST, prefix: str = ""):
    """(qualified name, lines) of every function in `node`, nested ones included ("outer.inner")."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = prefix + child.name
            yield name, child.end_lineno - child.lineno + 1
            yield from _functions(child, name + ".")
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, prefix + child.name + ".")
        else:
            yield from _functions(child, prefix)


def _over(sizes: dict[str, int], limit: int, allowed: dict[str, int]) -> list[str]:
    """The breaches of `limit` that the allow-list does not cover, and its stale entries."""
    problems = []
    for name, lines in sorted(sizes.items()):
        if lines > limit and name not in allowed:
            problems.append(f"{name}: {lines} lines (limit {limit}): split it")
        elif name in allowed and lines > allowed[name]:
            problems.append(f"{name}: {lines} lines, more than the {allowed[name]} it is allowed while over "
                            f"the limit of {limit}: make it smaller, not larger")
    for name, lines in sorted(allowed.items()):
        if sizes.get(name, 0) <= limit:
            problems.append(f"{name}: now within the limit of {limit} (or gone): remove it from the allow-list")
    return problems


def test_no_module_over_the_line_limit():
    sizes = {_name(p): len(p.read_text(encoding="utf-8").splitlines()) for p in _modules()}
    assert not _over(sizes, MAX_MODULE_LINES, MODULES_OVER), "\n".join(_over(sizes, MAX_MODULE_LINES, MODULES_OVER))


def test_no_function_over_the_line_limit():
    sizes = {}
    for path in _modules():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for name, lines in _functions(tree):
            key = f"{_name(path)}::{name}"
            sizes[key] = max(lines, sizes.get(key, 0))  # a name defined twice (if/else): the longer
    problems = _over(sizes, MAX_FUNCTION_LINES, FUNCTIONS_OVER)
    assert not problems, "\n".join(problems)


def _import_time_imports(node: ast.AST):
    """The imports a module runs when it is imported: not inside a function, not under TYPE_CHECKING."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            yield from (i for c in child.orelse for i in _import_time_imports(ast.Module([c], [])))
            continue
        if isinstance(child, ast.Import):
            for alias in child.names:
                yield child.lineno, alias.name, ""
        elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
            for alias in child.names:
                yield child.lineno, child.module, alias.name
        else:
            yield from _import_time_imports(child)


def test_no_heavy_library_imported_at_module_import_time():
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        folder = _name(path).split("/")[0]
        for line, module, name in _import_time_imports(ast.parse(path.read_text(encoding="utf-8"))):
            top = module.split(".")[0]
            if top in HEAVY and (folder, module, name) not in HEAVY_AT_IMPORT_ALLOWED:
                problems.append(f"{_name(path)}:{line} imports {module} at import time: import it inside "
                                "the function that needs it (CONTRIBUTING.md, heavy libraries)")
    assert not problems, "\n".join(problems)


def _module_file(module: str) -> str:
    """trainfit.a.b -> "a/b.py" (or "a/b/__init__.py" for a package)."""
    path = "/".join(module.split(".")[1:])
    return f"{path}/__init__.py" if (PACKAGE / path).is_dir() else f"{path}.py"


def test_no_private_name_imported_from_another_module():
    found: set[tuple[str, str]] = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("trainfit")):
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.add((_name(path), f"{_module_file(node.module)}::{alias.name}"))
    problems = [f"{importer} imports {name.replace('::', ' name ')}: make it a public name of its module"
                for importer, name in sorted(found - PRIVATE_IMPORTS)]
    problems += [f"{importer} no longer imports {name}: remove it from PRIVATE_IMPORTS"
                 for importer, name in sorted(PRIVATE_IMPORTS - found)]
    assert not problems, "\n".join(problems)


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_circle_through_a_package_init():
    grimp = pytest.importorskip("grimp", reason="grimp comes with import-linter (the test extra)")
    graph = grimp.build_graph("trainfit")
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    problems = []
    for circle in _circles(edges):
        members = set(circle)
        packages = sorted(m for m in members if any(o.startswith(m + ".") for o in members))
        if packages:
            problems.append(f"{', '.join(packages)} (the package's __init__) is in the import circle {circle}")
    assert not problems, "\n".join(problems)


def test_the_circle_finder_finds_a_circle_through_an_init():
    edges = {"p": {"p.a"}, "p.a": {"p.b"}, "p.b": {"p"}, "q": {"p"}}
    assert _circles(edges) == [["p", "p.a", "p.b"]]
