"""The import graph of src/fullband: no circles, and the model package stands alone (DESIGN.md §6).

Every ``import`` / ``from ... import`` of a fullband module counts, at module level or inside a function, so a
deferred import cannot hide a circle. ``from package import name`` is an edge to the submodule when ``name`` is
one, else to the package.
"""

import ast
import subprocess
import sys
from pathlib import Path

import fullband

SRC = Path(fullband.__file__).parent
MODEL_MAY_IMPORT = ("fullband.model", "fullband.config", "fullband.version")


def module_files() -> dict[str, Path]:
    modules = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative import
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parent, base] if base else parent)
                targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as [a, b, ..., a], or None (depth-first search, white/grey/black)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return [*stack[stack.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_graph_sees_deferred_and_relative_imports():
    graph = import_graph()
    assert "fullband.model.lm" in graph["fullband.model"]  # from package __init__
    assert "fullband.generation.decoding" in graph["fullband.generation"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_circles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_model_package_imports_only_itself_and_the_config():
    graph = import_graph()
    bad = sorted(f"{source} -> {target}" for source, targets in graph.items() if in_package(source, "fullband.model")
                 for target in targets if not any(in_package(target, ok) for ok in MODEL_MAY_IMPORT))
    assert not bad, "the model package imports from outside it: " + ", ".join(bad)


def test_decoding_is_bound_from_the_generation_side():
    # A fresh interpreter: the model package loads no decoding code, and the public API decodes all the same.
    code = (
        "import sys, torch\n"
        "import fullband.model\n"
        "assert 'fullband.generation' not in sys.modules\n"
        "from fullband import FullBandwidthLM, ModelConfig\n"
        "torch.manual_seed(0)\n"
        "model = FullBandwidthLM(ModelConfig(vocab_size=16, d_model=8, n_layers=1, n_heads=2, max_seq_len=16))\n"
        "ids = model.generate([1, 2, 3], max_new_tokens=4, mode='soft')\n"
        "assert len(ids) == 7 and ids[:3] == [1, 2, 3], ids\n"
        "assert len(list(model.stream([1, 2], max_new_tokens=3))) == 3\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
