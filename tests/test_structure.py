"""Imports point down only: no import cycle in nanoasr/ (module-level and function-level imports alike), the
lower layers (formats, quant, kernels, tensor, storage) never import the model or the edges above it, and
nothing imports the command line. Every function in nanoasr/ fits on a screen."""
import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "nanoasr"
LOWER = ("formats", "quant", "kernels", "tensor", "storage")
UPPER = re.compile(r"(model|api|cli|server|hub|convert)$")
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


def import_graph(package: Path) -> dict[str, set[str]]:
    """module -> the package's modules it imports anywhere in its body (inside functions too)."""
    known = modules(package)
    graph = {m: set() for m in known}
    for module, path in known.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for name in targets(node, module, path.name == "__init__.py", known):
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
    return module.split(".")[1] if "." in module else ""


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return [f"{a} -> {b}" for a, imported in sorted(graph.items()) for b in sorted(imported)
            if layer(a) in LOWER and UPPER.match(layer(b))]


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


def test_lower_layers_never_import_the_model_or_the_edges():
    assert upward_imports(import_graph(PACKAGE)) == []


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
