"""Imports point down only: no import cycle in nanoasr/ (module-level and function-level imports alike, and
`importlib.import_module` of a literal name), every import goes down the layer order of DESIGN §9, and nothing
imports the command line. Every function in nanoasr/ fits on a screen."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "nanoasr"
# The layers from the top: each imports only the lines below it. A layer is a top-level module or package of
# nanoasr ("__init__" is the package itself; "__main__", which runs the command line, tops it); within one,
# the package's own modules import each other freely, the cycle test keeping them acyclic.
ORDER = [
    {"__main__"},
    {"cli"},
    {"server", "ray", "__init__"},
    {"realtime", "batching"},
    {"api"},
    {"timestamps", "convert", "hub"},
    {"checkpoints"},
    {"model", "audio"},
    {"ops"},
    {"backend"},
    {"kernels", "formats"},
    {"tensor", "transcript"},
    {"quant", "writers"},
    {"storage", "xp", "errors", "untrusted"},
]
RANK = {layer: rank for rank, layers in enumerate(ORDER) for layer in layers}
MAX_FUNCTION_LINES = 60


def modules(package: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module under `package` (packages by their __init__)."""
    out = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def targets(node, module: str, is_package: bool, known) -> list[str]:
    """What one import statement names: `from a import b` is a.b where that is a module, else a."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:  # relative: climb from the importing module's package
        parts = module.split(".")
        kept = parts[:len(parts) - node.level + is_package]
        base = ".".join(kept + ([node.module] if node.module else []))
    submodules = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
    return submodules or [base]


def nearest_module(name: str, known) -> str | None:
    """`name` or the closest enclosing module that exists (`a.b.Thing` -> `a.b`)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def literal_import_module(node) -> str | None:
    """The name in `importlib.import_module("a.b")` (or a bare `import_module("a.b")`), or None."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func, name = node.func, node.args[0]
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if called == "import_module" and isinstance(name, ast.Constant) and isinstance(name.value, str):
        return name.value
    return None


def imported_names(node, module: str, is_package: bool, known) -> list[str]:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return targets(node, module, is_package, known)
    literal = literal_import_module(node)
    return [literal] if literal else []


def import_graph(package: Path) -> dict[str, set[str]]:
    """module -> the package's modules it imports anywhere in its body (inside functions too)."""
    known = modules(package)
    graph = {m: set() for m in known}
    for module, path in known.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for name in imported_names(node, module, path.name == "__init__.py", known):
                found = nearest_module(name, known)
                if found and found != module:
                    graph[module].add(found)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None."""
    on_path, done = [], set()

    def visit(module):
        on_path.append(module)
        for target in sorted(graph[module]):
            if target in on_path:
                return on_path[on_path.index(target):] + [target]
            if target not in done:
                cycle = visit(target)
                if cycle:
                    return cycle
        on_path.pop()
        done.add(module)
        return None

    for module in sorted(graph):
        if module not in done:
            cycle = visit(module)
            if cycle:
                return cycle
    return None


def layer(module: str) -> str:
    return module.split(".")[1] if "." in module else "__init__"


def climbs(a: str, b: str) -> bool:
    """Whether `a` importing `b` leaves its layer for one not below it (a layer missing from ORDER climbs)."""
    la, lb = layer(a), layer(b)
    if la == lb:
        return False
    return la not in RANK or lb not in RANK or RANK[lb] <= RANK[la]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return [f"{a} -> {b}" for a, imported in sorted(graph.items()) for b in sorted(imported)
            if climbs(a, b)]


def long_functions(package: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """`path:line name (n lines)` of every function, method or nested function longer than `limit` lines."""
    out = []
    for path in sorted(package.rglob("*.py")):
        functions = [node for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                     if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for node in sorted(functions, key=lambda f: f.lineno):
            lines = node.end_lineno - node.lineno + 1
            if lines > limit:
                out.append(f"{path.relative_to(package.parent)}:{node.lineno} {node.name} ({lines} lines)")
    return out


def test_no_import_cycles():
    cycle = find_cycle(import_graph(PACKAGE))
    assert cycle is None, " -> ".join(cycle)


def test_every_import_goes_down_the_layer_order():
    assert upward_imports(import_graph(PACKAGE)) == []


def test_every_layer_of_the_package_is_in_the_order():
    assert {layer(m) for m in modules(PACKAGE)} - set(RANK) == set()


def test_the_command_line_is_the_outermost_edge():
    """Nothing imports nanoasr.cli but its own modules and __main__; the server is started by cli.serve."""
    graph = import_graph(PACKAGE)
    importers = {edge: sorted(a for a, imported in graph.items() if layer(a) != edge
                              and any(layer(b) == edge for b in imported)) for edge in ("cli", "server")}
    assert importers == {"cli": ["nanoasr.__main__"], "server": ["nanoasr.cli.serve"]}


def test_the_kernels_import_only_storage_and_themselves_and_the_backend_never_imports_ops():
    edges = [(a, b) for a, imported in sorted(import_graph(PACKAGE).items()) for b in sorted(imported)]
    assert [f"{a} -> {b}" for a, b in edges
            if layer(a) == "kernels" and layer(b) not in ("kernels", "storage")
            or layer(a) == "backend" and layer(b) == "ops"] == []


def test_every_function_fits_on_a_screen():
    assert long_functions(PACKAGE) == []


def write_package(root: Path, files: dict[str, str]) -> Path:
    package = root / "pkg"
    for name, text in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return package


def test_a_cycle_through_a_function_level_import_is_found(tmp_path):
    package = write_package(tmp_path, {
        "__init__.py": "", "tensor.py": "def widen():\n    from pkg.quant.reference import dequantize\n",
        "quant/__init__.py": "", "quant/reference.py": "from pkg.tensor import widen\n"})
    assert find_cycle(import_graph(package)) in (["pkg.quant.reference", "pkg.tensor", "pkg.quant.reference"],
                                                 ["pkg.tensor", "pkg.quant.reference", "pkg.tensor"])


def test_upward_and_relative_imports_are_found(tmp_path):
    package = write_package(tmp_path, {
        "__init__.py": "", "model/__init__.py": "", "model/weights.py": "", "cli/__init__.py": "",
        "cli/convert.py": "", "formats/__init__.py": "", "formats/gguf.py": "from ..model import weights\n",
        "formats/other.py": "def main():\n    import pkg.cli.convert\n"})
    graph = import_graph(package)
    assert find_cycle(graph) is None
    assert upward_imports(graph) == ["pkg.formats.gguf -> pkg.model.weights",
                                     "pkg.formats.other -> pkg.cli.convert"]


def function(name: str, lines: int, indent: str = "") -> str:
    """Source of a function `lines` lines long."""
    return f"{indent}def {name}():\n" + "".join(f"{indent}    x = {i}\n" for i in range(lines - 1))


def test_long_methods_and_nested_functions_are_found(tmp_path):
    package = write_package(tmp_path, {
        "__init__.py": "", "fits.py": function("sixty", 60),
        "deep/__init__.py": "",
        "deep/long.py": ("class A:\n" + function("method", 61, "    ")
                         + "def outer():\n" + function("inner", 61, "    "))})
    assert long_functions(package) == ["pkg/deep/long.py:2 method (61 lines)",
                                       "pkg/deep/long.py:63 outer (62 lines)",
                                       "pkg/deep/long.py:64 inner (61 lines)"]


def test_a_literal_import_module_is_an_edge(tmp_path):
    package = write_package(tmp_path, {
        "__init__.py": "", "api.py": "",
        "ops.py": "import importlib\n\ndef table(name):\n    importlib.import_module(name)\n"
                  "    return importlib.import_module('pkg.api')\n"})
    assert upward_imports(import_graph(package)) == ["pkg.ops -> pkg.api"]
