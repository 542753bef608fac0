"""The package's import graph: no cycles, and no import from a lower layer into a higher one.

Every ``import`` in every module of ``fastvideo_cute`` counts, at module level or inside a
function (a lazy import is still a dependency). Layers, bottom to top, are listed in ``LAYERS``;
a module may import modules of its own layer or below. A new module must be given a layer here.
"""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1] / "fastvideo_cute"

# (layer, module-name prefixes), bottom to top. "fastvideo_cute." is implied.
LAYERS = [
    (0, ("errors", "env", "_version", "cache_dirs", "jit")),  # foundation: stdlib (+ lazily the CuTe DSL)
    (1, ("kernels",)),  # kernels: never torch in kernels.cute
    (2, ("metadata", "tiling", "validation", "reference", "call", "warmup_presets", "padding_probe",
         "pair_counts")),  # data-path leaves
    (3, ("adapters",)),
    (4, ("backends",)),
    (5, ("routes", "route_table")),
    (6, ("ops", "vsa_ops", "vsa_pipeline", "vsa_autograd")),
    (7, ("api",)),
    (8, ("api_indices", "varlen", "compat", "distributed")),
    (9, ("__init__",)),
    (10, ("warmup", "compile_check", "demo")),  # command-line tools: nothing below imports them
]


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules():
    return {_module_name(p): p for p in ROOT.rglob("*.py")}


def _resolve(module: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not is_pkg:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _edges(modules):
    edges = {}
    for name, path in modules.items():
        is_pkg = path.name == "__init__.py"
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_pkg, node)
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    targets.add(full if full in modules else base)
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module" and node.args \
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                targets.add(node.args[0].value)
        edges[name] = {t for t in targets if t in modules and t != name}
    return edges


def _layer(module: str) -> int:
    short = module[len("fastvideo_cute."):] if module != "fastvideo_cute" else "__init__"
    best = None
    for layer, prefixes in LAYERS:
        for prefix in prefixes:
            if short == prefix or short.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (layer, len(prefix))
    assert best is not None, f"{module} has no layer: add it to LAYERS in {__file__}"
    return best[0]


def test_no_upward_import():
    edges = _edges(_modules())
    upward = sorted(f"{a} (layer {_layer(a)}) imports {b} (layer {_layer(b)})"
                    for a, targets in edges.items() for b in targets if _layer(b) > _layer(a))
    assert not upward, "imports from a lower layer into a higher one:\n" + "\n".join(upward)


def test_no_import_cycle():
    edges = _edges(_modules())
    state, stack, cycles = {}, [], []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if nxt.startswith(node + "."):
                continue  # a package importing its own submodule is not a cycle
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_cute_kernels_never_import_torch():
    offenders = []
    for name, path in _modules().items():
        if not name.startswith("fastvideo_cute.kernels.cute"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{name}: {n}" for n in names if n == "torch" or n.startswith("torch.")]
    assert not offenders, offenders


def test_the_graph_walker_sees_lazy_and_relative_imports(tmp_path):
    # A check that cannot fail is no check: the walker must see a lazy relative import.
    mods = _modules()
    edges = _edges(mods)
    assert "fastvideo_cute.backends" in edges["fastvideo_cute.routes"]
    assert "fastvideo_cute.kernels.triton.block_sparse_fwd" in edges["fastvideo_cute.backends.triton_backend"]
