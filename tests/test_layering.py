"""Every import inside the package points down the layers of docs/architecture.md, and no two files
import each other (issue 32, step 2). Imports are read from the source (an AST walk), so module-level,
function-level and ``if TYPE_CHECKING:`` imports all count: a type-only import still ties a lower layer
to a higher one. The layer order is read from the document's ``layers`` block (issue 59, item 5), so the
document is the rule itself."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import layerscope

SRC = Path(layerscope.__file__).parent
ARCHITECTURE = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def read_layers(text: str) -> list[list[str]]:
    """The layers, bottom to top, of the one fenced ``layers`` block in ``text``: one layer a line, its
    name, a colon, then the top-level modules and packages it holds, separated by spaces."""
    blocks = re.findall(r"^```layers\n(.*?)^```", text, flags=re.M | re.S)
    assert len(blocks) == 1, "docs/architecture.md has one ```layers block"
    layers = []
    for line in blocks[0].splitlines():
        if line.strip():
            name, sep, heads = line.partition(":")
            assert sep and heads.split(), f"a layer line is 'name: module ...', got {line!r}"
            layers.append(heads.split())
    return layers


# docs/architecture.md's order, bottom to top; a module imports its own layer and the ones below it
LAYERS = read_layers(ARCHITECTURE.read_text(encoding="utf-8"))
RANK = {head: i for i, heads in enumerate(LAYERS) for head in heads}
# the deprecated aliases (layerscope.report, ...) are kept for one release and imported by nothing
# inside the package: the top layer, so that any import of one shows up below
ALIASES = {"report", "memory_report", "latency_report", "compare"}

# Violations other slices of issue 32 remove in parallel; the lead empties these lists after merging.
# Anything not listed fails.
KNOWN_UPWARD: set[tuple[str, str]] = set()      # none left (issue 32): keep it empty
KNOWN_CYCLES: list[set[str]] = []


def module_file(parts: list[str]) -> str | None:
    """The file (relative to the package) of a module given as dotted parts below the package."""
    path = SRC.joinpath(*parts)
    if path.with_suffix(".py").is_file():
        return "/".join(parts) + ".py"
    if (path / "__init__.py").is_file():
        return "/".join(parts + ["__init__.py"])
    return None


def imported_files(rel: str) -> set[str]:
    """The package's files that ``rel`` imports, wherever the import statement stands."""
    parts = rel[:-3].split("/")
    package = parts[:-1]                  # what a relative import of level 1 is relative to
    out = set()
    for node in ast.walk(ast.parse((SRC / rel).read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name.split(".")[1:] for a in node.names if a.name.split(".")[0] == "layerscope"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
                mod = base + (node.module.split(".") if node.module else [])
            elif node.module and node.module.split(".")[0] == "layerscope":
                mod = node.module.split(".")[1:]
            else:
                continue
            # `from pkg import name`: the module pkg.name where there is one, else pkg itself
            targets = [mod + [a.name] if module_file(mod + [a.name]) else mod for a in node.names]
        else:
            continue
        for t in targets:
            f = module_file(t)
            if f is not None and f != rel:
                out.add(f)
    return out


def graph() -> dict[str, set[str]]:
    files = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py"))
    return {f: imported_files(f) for f in files}


def rank(rel: str) -> int:
    head = rel.split("/")[0].removesuffix(".py")
    return len(LAYERS) if head in ALIASES else RANK.get(head, len(LAYERS) - 1)


def test_every_import_points_down():
    upward = {(src, dst) for src, dsts in graph().items() for dst in dsts
              if src != "__init__.py" and rank(dst) > rank(src)}   # the root re-exports everything
    assert upward - KNOWN_UPWARD == set(), "imports that point up docs/architecture.md's layers"
    assert KNOWN_UPWARD - upward == set(), "fixed: take these off KNOWN_UPWARD"


def cycles(g: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one file (Tarjan, iteratively)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    for root in g:
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(g.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(comp)
    return out


def test_no_import_cycle_between_files():
    g = graph()
    # the package root imports every layer and every file's import runs it first: not a circle of files
    g = {f: {d for d in dsts if d != "__init__.py"} for f, dsts in g.items()}
    found = cycles(g)
    assert [c for c in found if c not in KNOWN_CYCLES] == [], "files that import each other"
    assert [c for c in KNOWN_CYCLES if c not in found] == [], "fixed: take these off KNOWN_CYCLES"


def test_the_walk_sees_every_kind_of_import():
    # a guard on the test itself: function-level and type-only imports are read, relative ones resolved
    assert {"formats/onnx.py", "reports/table.py", "errors.py"} <= imported_files("reports/onnx.py")
    assert "render/timeline.py" in imported_files("render/views.py")          # inside a function
    assert "planning/steptime/schedule.py" in imported_files("reports/plan.py")        # under TYPE_CHECKING
    assert "capture/recorder.py" in imported_files("capture/session.py")


def test_the_layer_order_is_the_documents():
    # a guard on the parse: each head in one layer, the base at the bottom, the package root at the top
    heads = [h for layer in LAYERS for h in layer]
    assert len(heads) == len(set(heads)), "a module placed in two layers"
    assert "_compat" in LAYERS[0] and "trace" in LAYERS[0] and "__init__" in LAYERS[-1]
    assert LAYERS.index(["capture"]) < LAYERS.index(["planning"]) < LAYERS.index(["reports"])
    assert read_layers("text\n```layers\nbase: a b\n\ntop: c\n```\nmore") == [["a", "b"], ["c"]]
