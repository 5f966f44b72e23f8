"""The package's import structure, read from the source (no module is imported).

Three promises a reader relies on, checked over every module of the five package
directories (installed as speccompile, speccompile.runtime, speccompile.models,
speccompile.passes and speccompile.kernels; see pyproject.toml):

- no import cycle among our modules, counting imports inside functions: a lazy import
  that hides a cycle still couples the two modules both ways;
- no module reaches into another's underscore names (``from .x import _y`` or
  ``x._y``): what is shared is public, in the module that owns it;
- the runtime never imports the compiler: nothing a ``speccompile.runtime`` module
  imports, directly or through other modules, is ``speccompile.models``,
  ``speccompile.passes``, ``speccompile.kernels`` or a TVM module outside ``tvm.runtime`` (README: applications
  embed the runtime without the compiler).

Pure Python and AST-based, so it runs in well under a second.
"""
from __future__ import annotations

import ast
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"speccompile": "speccompile", "speccompile.runtime": "runtime", "speccompile.models": "models",
            "speccompile.passes": "passes", "speccompile.kernels": "kernels"}  # name -> directory (package-dir)
RUNTIME = "speccompile.runtime"
COMPILER = ("speccompile.models", "speccompile.passes", "speccompile.kernels", "speccompile.compiler")
# What the runtime may use of TVM: tvm.runtime (and tvm.runtime.vm ...) and the runtime
# names the top-level package re-exports; everything else (relax, tirx, te, target, ir ...)
# is the compiler.
TVM_RUNTIME_NAMES = {"runtime", "cpu", "cuda", "device", "opencl", "metal", "rocm", "vulkan", "ext_dev",
                     "DataType", "DataTypeCode", "Object", "TVMError", "error", "get_global_func",
                     "register_global_func", "register_object"}


@dataclass(frozen=True)
class Use:
    """One import (or attribute use) of a module, where it is written."""

    source: str  # the importing module
    target: str  # the imported module (ours or external), or the full dotted name used
    name: str | None  # the name taken from it (``from target import name``, ``target.name``), if any
    path: str  # file, relative to the repository
    line: int
    scope: str  # "module level" or "in f()"
    text: str

    def where(self) -> str:
        return f"{self.path}:{self.line} ({self.scope}): {self.text}"


@dataclass
class Module:
    name: str
    path: Path
    is_package: bool
    imports: list[Use] = field(default_factory=list)  # every import statement's targets
    attributes: list[Use] = field(default_factory=list)  # ``module.name`` through an imported module


def discover() -> dict[str, Module]:
    mods = {}
    for pkg, folder in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            name = ".".join((pkg,) + (parts[:-1] if is_package else parts))
            mods[name] = Module(name, path, is_package)
    return mods


def resolve_relative(mod: Module, level: int, module: str | None) -> str:
    """The absolute name of ``from {'.' * level}{module} import ...`` written in ``mod``."""
    if level == 0:
        return module or ""
    base = mod.name.split(".") if mod.is_package else mod.name.split(".")[:-1]
    if level - 1 > len(base) - 1:
        raise ValueError(f"{mod.path}: relative import beyond the top-level package")
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def local_names(func: ast.AST) -> set[str]:
    """Names a function binds itself (parameters, assignments), which hide a module's
    import of the same name inside it. Nested functions and classes are their own scopes."""
    names: set[str] = set()
    args = func.args
    for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
        if a is not None:
            names.add(a.arg)
    todo = list(ast.iter_child_nodes(func))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        todo.extend(ast.iter_child_nodes(node))
    return names


class Reader(ast.NodeVisitor):
    """Collects a module's imports and its attribute uses through imported modules, with
    the function they sit in and Python's scoping of imported names."""

    def __init__(self, mod: Module, ours: dict[str, Module], source: str):
        self.mod, self.ours, self.lines = mod, ours, source.splitlines()
        self.scopes: list[tuple[str, dict[str, str], set[str]]] = []  # (name, imports, hiding locals)

    def use(self, node: ast.AST, target: str, name: str | None) -> Use:
        text = self.lines[node.lineno - 1].strip()
        scope = f"in {self.scopes[-1][0]}()" if len(self.scopes) > 1 else "module level"
        return Use(self.mod.name, target, name, str(self.mod.path.relative_to(ROOT)), node.lineno, scope, text)

    def bindings(self, body: ast.AST) -> dict[str, str]:
        """name -> module bound by the import statements of one scope (not nested ones)."""
        bound: dict[str, str] = {}
        todo = list(ast.iter_child_nodes(body))
        while todo:
            node = todo.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            if isinstance(node, ast.Import):
                for a in node.names:  # ``import a.b as x`` binds x to a.b; ``import a.b`` binds a to a
                    if a.asname:
                        bound[a.asname] = a.name
                    else:
                        bound[a.name.split(".")[0]] = a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom):
                base = resolve_relative(self.mod, node.level, node.module)
                for a in node.names:
                    full = f"{base}.{a.name}"
                    if full in self.ours or not base.startswith("speccompile"):
                        bound[a.asname or a.name] = full  # a module (ours), or maybe one (external)
            todo.extend(ast.iter_child_nodes(node))
        return bound

    def lookup(self, name: str) -> str | None:
        for _, imports, hidden in reversed(self.scopes):
            if name in imports:
                return imports[name]
            if name in hidden:
                return None
        return None

    def visit_Module(self, node: ast.Module) -> None:
        self.scopes.append(("<module>", self.bindings(node), set()))
        self.generic_visit(node)

    def visit_FunctionDef(self, node) -> None:
        imports = self.bindings(node)
        self.scopes.append((node.name, imports, local_names(node) - set(imports)))
        self.generic_visit(node)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self.mod.imports.append(self.use(node, a.name, None))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = resolve_relative(self.mod, node.level, node.module)
        for a in node.names:
            full = f"{base}.{a.name}"
            if full in self.ours:  # ``from . import engine``: the module itself
                self.mod.imports.append(self.use(node, full, None))
            else:
                self.mod.imports.append(self.use(node, base, a.name))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        parts, inner = [node.attr], node.value
        while isinstance(inner, ast.Attribute):
            parts.append(inner.attr)
            inner = inner.value
        if not isinstance(inner, ast.Name):
            self.generic_visit(node)
            return
        parts.reverse()
        target = self.lookup(inner.id)
        if target is not None:
            for i, part in enumerate(parts):  # walk down submodules; the first other name is the attribute
                if f"{target}.{part}" in self.ours and i < len(parts) - 1:
                    target = f"{target}.{part}"
                    continue
                self.mod.attributes.append(self.use(node, target, part))
                break
        # the inner Attribute nodes are this chain's prefixes: not visited again


def read_all() -> dict[str, Module]:
    mods = discover()
    for mod in mods.values():
        source = mod.path.read_text()
        Reader(mod, mods, source).visit(ast.parse(source, str(mod.path)))
    return mods


def graph(mods: dict[str, Module]) -> dict[str, dict[str, list[Use]]]:
    """source -> target -> the imports making that edge, over our modules only."""
    edges: dict[str, dict[str, list[Use]]] = {m: {} for m in mods}
    for mod in mods.values():
        for use in mod.imports:
            if use.target in mods and use.target != mod.name:
                edges[mod.name].setdefault(use.target, []).append(use)
    return edges


def strongly_connected(edges: dict[str, dict[str, list[Use]]]) -> list[list[str]]:
    """Tarjan's components with more than one module (every import cycle lies in one)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def shortest_cycle(start: str, comp: set[str], edges: dict[str, dict[str, list[Use]]]) -> list[str]:
    parent: dict[str, str] = {}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(edges[v]):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return path[::-1] + [start]
            if w in comp and w not in parent:
                parent[w] = v
                queue.append(w)
    return [start]


def describe_cycles(mods: dict[str, Module]) -> list[str]:
    edges = graph(mods)
    reports = []
    for comp in strongly_connected(edges):
        members = set(comp)
        cycle = shortest_cycle(comp[0], members, edges)
        lines = [f"import cycle: {' -> '.join(cycle)}" + (f"  (component: {', '.join(comp)})" if len(comp) > 2 else "")]
        for src in comp:
            for dst in sorted(edges[src]):
                if dst in members:
                    for where in dict.fromkeys(use.where() for use in edges[src][dst]):  # one line per statement
                        lines.append(f"    {src} -> {dst}    {where}")
        reports.append("\n".join(lines))
    return reports


def is_private(name: str | None) -> bool:
    return bool(name) and name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def describe_private(mods: dict[str, Module]) -> list[str]:
    found = []
    for mod in mods.values():
        for use in mod.imports + mod.attributes:
            if use.target in mods and use.target != mod.name and is_private(use.name):
                found.append(f"{mod.name} uses {use.target}.{use.name}    {use.where()}")
    return found


def tvm_compiler_name(use: Use) -> str | None:
    """The dotted TVM name if ``use`` reaches TVM outside its runtime, else None."""
    dotted = use.target + (f".{use.name}" if use.name else "")
    parts = dotted.split(".")
    if parts[0] != "tvm" or len(parts) == 1:
        return None
    return None if parts[1] in TVM_RUNTIME_NAMES else dotted


def describe_runtime_reach(mods: dict[str, Module]) -> list[str]:
    """What the runtime reaches of the compiler, with the chain of imports that gets there.

    Importing a module also runs its parent packages' ``__init__``, so those count too."""
    edges = graph(mods)
    for name in mods:  # importing a.b.c runs a/__init__ and a/b/__init__ first
        parts = name.split(".")
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if parent in mods and parent != name:
                edges[name].setdefault(parent, [])
    via: dict[str, str | None] = {m: None for m in mods if m == RUNTIME or m.startswith(RUNTIME + ".")}
    queue = deque(sorted(via))
    while queue:
        v = queue.popleft()
        for w in sorted(edges[v]):
            if w not in via:
                via[w] = v
                queue.append(w)

    def chain(m: str) -> str:
        path = [m]
        while via[path[-1]] is not None:
            path.append(via[path[-1]])
        return " -> ".join(reversed(path))

    found = []
    for m in sorted(via):
        for use in mods[m].imports:
            if use.target.startswith(COMPILER):
                found.append(f"the runtime reaches the compiler: {chain(m)} -> {use.target}    {use.where()}")
        for use in mods[m].imports + mods[m].attributes:
            name = tvm_compiler_name(use)
            if name:
                found.append(f"the runtime reaches TVM's compiler: {chain(m)} uses {name}    {use.where()}")
    return found


# ------------------------------------------------------------------ the checks
@pytest.fixture(scope="module")
def mods():
    return read_all()


def test_every_package_directory_is_read(mods):
    """Guards the checks below against reading nothing (a moved directory, a renamed package)."""
    for pkg, folder in PACKAGES.items():
        assert pkg in mods, f"{folder}/__init__.py not found"
        assert sum(m.startswith(pkg + ".") and m.count(".") == pkg.count(".") + 1 for m in mods) >= 3, pkg
    try:
        import tomllib
    except ImportError:  # Python 3.10: pyproject is not readable without a dependency
        return
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    subpackages = {m for m, mod in mods.items() if mod.is_package and m.count(".") >= 1 and m not in PACKAGES}
    assert conf["package-dir"] == PACKAGES and sorted(conf["packages"]) == sorted({*PACKAGES, *subpackages})


def test_the_package_is_laid_out_by_capability(mods):
    """speccompile/ holds subpackages by capability (cli, compiler, serving, bench, gpu_check,
    training) and at most 12 modules of its own; no source file grows past 600 lines."""
    top = [m for m, mod in mods.items() if m.count(".") == 1 and m.startswith("speccompile.") and not mod.is_package]
    assert len(top) <= 12, top
    long = {m: n for m, mod in mods.items() if (n := len(mod.path.read_text().splitlines())) > 600}
    assert not long, long


def test_no_import_cycles(mods):
    cycles = describe_cycles(mods)
    if cycles:
        pytest.fail("\n\n".join(cycles), pytrace=False)


def test_no_module_uses_another_modules_private_names(mods):
    private = describe_private(mods)
    if private:
        pytest.fail("\n".join(private), pytrace=False)


def test_the_runtime_never_imports_the_compiler(mods):
    reach = describe_runtime_reach(mods)
    if reach:
        pytest.fail("\n".join(reach), pytrace=False)


# ------------------------------------------------------------------ the checker checks itself
def _read(tmp_path: Path, files: dict[str, str], monkeypatch) -> dict[str, Module]:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for folder in PACKAGES.values():
        (tmp_path / folder).mkdir(exist_ok=True)
        (tmp_path / folder / "__init__.py").touch()
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    return read_all()


def test_the_checker_finds_lazy_cycles_private_names_and_compiler_imports(tmp_path, monkeypatch):
    mods = _read(tmp_path, {
        "speccompile/a.py": "from . import b\n",
        "speccompile/b.py": "def f():\n    from .a import thing\n",
        "speccompile/c.py": "from .d import _hidden\nfrom . import d\nx = d._other\n\ndef g(d):\n    return d._fine\n",
        "speccompile/d.py": "__all__ = []\n",
        "runtime/r.py": "import tvm\nfrom ..e import helper\n\ndef h():\n    return tvm.runtime.load_module, tvm.cpu()\n",
        "speccompile/e.py": "def helper():\n    from .models import llama\n",
        "models/llama.py": "",
        "runtime/s.py": "from tvm import relax\nimport tvm.relax.frontend\nfrom tvm.runtime.vm import VirtualMachine\n",
    }, monkeypatch)
    cycles = describe_cycles(mods)
    assert len(cycles) == 1 and "speccompile.a -> speccompile.b -> speccompile.a" in cycles[0]
    assert "speccompile/b.py:2 (in f()): from .a import thing" in cycles[0]
    private = describe_private(mods)
    assert len(private) == 2 and "speccompile.d._hidden" in private[0] and "speccompile.d._other" in private[1]
    reach = "\n".join(describe_runtime_reach(mods))
    assert "speccompile.runtime.r -> speccompile.e -> speccompile.models.llama" in reach
    assert "tvm.relax" in reach and "tvm.relax.frontend" in reach
    assert "load_module" not in reach and "tvm.cpu" not in reach and "VirtualMachine" not in reach


def test_a_runtime_process_loads_tvm_without_its_compiler_or_torch():
    """What ``generate``, ``chat`` and ``serve`` do first (runtime/tvm_import.py): the
    runtime library alone, no torch during that import, and torch still importable after."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from speccompile.runtime.tvm_import import import_runtime_only\n"
            "assert import_runtime_only()\n"
            "import tvm.base, os\n"
            "assert tvm.base._RUNTIME_ONLY and 'TVM_USE_RUNTIME_LIB' not in os.environ\n"
            "assert 'tvm.relax' not in sys.modules and 'torch' not in sys.modules, sorted(sys.modules)\n"
            "from tvm.runtime import tensor\n"
            "import numpy as np; assert tensor(np.arange(3, dtype='float32')).numpy().sum() == 3\n"
            "import torch; assert torch.ones(2).sum() == 2\n"
            "assert not import_runtime_only()\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]


def test_the_runtime_import_registers_the_same_classes_without_raising_for_absent_types():
    """runtime/tvm_import.py answers the lookups of types the runtime lacks from the registered
    keys instead of letting tvm-ffi raise (0.2 s of backtrace the first time): the same Python
    classes end up registered as with tvm-ffi's own lookup, which is back after the import."""
    import json
    import subprocess
    import sys

    code = ("import json, os, sys\n"
            "from tvm_ffi import core\n"
            "own = core._object_type_key_to_index\n"
            "if sys.argv[1] == 'ours':\n"
            "    from speccompile.runtime.tvm_import import import_runtime_only\n"
            "    assert import_runtime_only()\n"
            "    assert core._object_type_key_to_index is own\n"
            "else:  # the same import with tvm-ffi's lookup throughout\n"
            "    os.environ['TVM_USE_RUNTIME_LIB'] = '1'; sys.modules['torch'] = None\n"
            "    import tvm\n"
            "registered = sorted({f'{c.__module__}.{c.__qualname__}' for name, m in list(sys.modules.items())\n"
            "                     if name.split('.')[0] in ('tvm', 'tvm_ffi') and m is not None\n"
            "                     for c in list(vars(m).values()) if isinstance(c, type)\n"
            "                     and '__tvm_ffi_type_info__' in vars(c)})\n"
            "print(json.dumps(registered))\n")
    runs = [subprocess.run([sys.executable, "-c", code, how], capture_output=True, text=True) for how in ("ours", "own")]
    assert all(r.returncode == 0 for r in runs), [r.stderr[-1500:] for r in runs]
    ours, own = (json.loads(r.stdout.strip().splitlines()[-1]) for r in runs)
    assert ours == own and len(ours) > 10
