"""The package's module dependency graph, read from the source (no module is imported).

Every import counts: module level, inside functions and under ``if TYPE_CHECKING:`` alike, since
each is a dependency of one module on another even when it does not run at import. An edge
``a -> b`` means module ``a`` names module ``b`` (``from . import b``, ``from .b import x``,
``import splat_train.trainer.b``); ``from .pkg import name`` counts ``pkg.name`` when that is a
module, else ``pkg``.

    python -m splat_train.scripts.import_graph            # the map: module, lines, imported by
    python -m splat_train.scripts.import_graph --check    # exit 1 on a cycle or a stray torch.distributed

tests/test_architecture.py runs the same checks in CI.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("trainer", "kernels", "scripts", "configs")
PREFIX = "splat_train"

DISTRIBUTED_HOMES = {"trainer.exchange", "trainer.sparse_exchange", "trainer.launch"}
"""The only modules that may import torch.distributed (or torch.nn.parallel's DDP)."""


def modules(root: Path = ROOT) -> dict[str, Path]:
    """{dotted name relative to splat_train (e.g. "trainer.loop"): file} of every module."""
    out = {}
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _resolve(name: str, known: dict[str, Path]) -> "str | None":
    """The module of ``known`` that a dotted name (relative to splat_train) refers to: the name
    itself, or its longest known prefix."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in known:
            return candidate
        parts.pop()
    return None


def imports_of(module: str, path: Path, known: dict[str, Path]) -> tuple[set[str], set[str]]:
    """(package modules that ``module`` imports, external top-level names it imports: e.g.
    "torch.distributed"), every import statement of the file counted."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    package = module.split(".") if is_pkg else module.split(".")[:-1]
    internal, external = set(), set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PREFIX + "."):
                    names.append(alias.name[len(PREFIX) + 1 :])
                else:
                    external.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith(PREFIX + "."):
                stem = node.module[len(PREFIX) + 1 :]
            elif node.module == PREFIX:
                stem = ""
            else:
                for alias in node.names:
                    external.add(f"{node.module}.{alias.name}")
                external.add(node.module or "")
                continue
            for alias in node.names:
                full = f"{stem}.{alias.name}" if stem else alias.name
                names.append(full if full in known else stem)
        for name in names:
            target = _resolve(name, known)
            if target is not None and target != module:
                internal.add(target)
    return internal, external


def graph(root: Path = ROOT) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """({module: package modules it imports}, {module: external names it imports})."""
    known = modules(root)
    edges, external = {}, {}
    for name, path in known.items():
        edges[name], external[name] = imports_of(name, path, known)
    return edges, external


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(out)


def distributed_importers(external: dict[str, set[str]]) -> list[str]:
    """Modules that import torch.distributed (or DDP from torch.nn.parallel)."""
    return sorted(
        m
        for m, names in external.items()
        if any(
            n == "torch.distributed" or n.startswith("torch.distributed.") or n.startswith("torch.nn.parallel")
            for n in names
        )
    )


def module_map(root: Path = ROOT) -> list[tuple[str, int, list[str]]]:
    """[(module, lines, modules that import it)] sorted by module."""
    known = modules(root)
    edges, _ = graph(root)
    users: dict[str, list[str]] = {m: [] for m in known}
    for m, targets in edges.items():
        for t in targets:
            users[t].append(m)
    return [(m, len(known[m].read_text().splitlines()), sorted(users[m])) for m in sorted(known)]


def main(argv: "list[str] | None" = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 on a cycle or a stray torch.distributed import")
    args = parser.parse_args(argv)
    edges, external = graph()
    found = cycles(edges)
    stray = sorted(set(distributed_importers(external)) - DISTRIBUTED_HOMES)
    if not args.check:
        for m, lines, users in module_map():
            print(f"{m:<32}{lines:>5}  <- {', '.join(users) or '-'}")
    print(f"torch.distributed: {', '.join(distributed_importers(external))}")
    for c in found:
        print("cycle: " + " <-> ".join(c))
    for m in stray:
        print(f"stray torch.distributed import: {m}")
    return 1 if args.check and (found or stray) else 0


if __name__ == "__main__":
    sys.exit(main())
