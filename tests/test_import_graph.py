"""The import graph of src/fullband: no circles, the model package stands alone, and no layer imports from one
above it (DESIGN.md §6).

Every ``import`` / ``from ... import`` of a fullband module counts, at module level or inside a function, so a
deferred import cannot hide a circle. ``from package import name`` is an edge to the submodule when ``name`` is
one, else to the package. So does every string that names a fullband module (``"fullband.x.y"`` or
``"fullband.x.y:Name"``): ``importlib.import_module`` of a string, a lazy-export table, the model-family table.
The one exception is the arguments of ``RemoteCode(...)``: a module name written into a checkpoint's remote-code
files, which transformers imports later and the writer never does.
"""

import ast
import re
import subprocess
import sys
from pathlib import Path

import fullband

SRC = Path(fullband.__file__).parent
MODULE_STRING = re.compile(r"fullband(\.\w+)+(:\w+)?")
WRITTEN_NOT_IMPORTED = "RemoteCode"  # its string arguments name modules for generated files

# Lowest first; a module imports only from its own layer or below. The longest matching package decides (the
# top-level package ``fullband``, the public API's lazy facade, matches only itself).
LAYERS = (
    # torch-free: options, the decoding modes, the context rule, the CPU facts a kernel choice reads, how a file is
    # written
    ("fullband.version", "fullband.config", "fullband.configio", "fullband.devices", "fullband.modes", "fullband.hub",
     "fullband.context", "fullband.files", "fullband.rundir"),
    ("fullband.model",),  # the network: stands alone
    ("fullband.generation", "fullband.tasks", "fullband.data"),  # decoding; synthetic tasks; tokenizers, corpora
    ("fullband.integrations",),  # transformers (Auto classes, retrofit) and llama conversion
    ("fullband.families",),  # the model families' specs: build, load, tokenize, save any model
    ("fullband.training",),
    ("fullband", "fullband.experiments", "fullband.serve", "fullband.bench", "fullband.selfcheck",
     "fullband.evaluation"),  # applications over the library
    ("fullband.cli",),
)
MODEL_MAY_IMPORT = ("fullband.model", *LAYERS[0])  # the model package stands on the torch-free base alone


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
        tree = ast.parse(path.read_text())
        written = {id(arg) for node in ast.walk(tree) if isinstance(node, ast.Call) and _called(node)
                   == WRITTEN_NOT_IMPORTED for arg in [*node.args, *(k.value for k in node.keywords)]}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in written:
                if MODULE_STRING.fullmatch(node.value):
                    targets.add(node.value.partition(":")[0])
            elif isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative import
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parent, base] if base else parent)
                targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _called(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def layer_of(module: str) -> int:
    """The index in LAYERS of the longest package that holds ``module``."""
    matches = [(len(package), index) for index, packages in enumerate(LAYERS) for package in packages
               if module == package or (package != "fullband" and module.startswith(package + "."))]
    assert matches, f"{module} is in no layer: add it to LAYERS"
    return max(matches)[1]


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


def test_the_graph_sees_deferred_relative_and_string_named_imports():
    graph = import_graph()
    assert "fullband.model.lm" in graph["fullband.model"]  # from package __init__
    assert "fullband.generation.decoding" in graph["fullband.generation"]
    assert "fullband.integrations.retrofit.lm" in graph["fullband.families.table"]  # "module:Class"
    assert "fullband.integrations.hf_retrofit" in graph["fullband.families.table"]  # a module string
    assert "fullband.integrations.llama" in graph["fullband.integrations"]  # a lazy-export table
    assert "fullband.integrations.hf" not in graph["fullband.hub"]  # written into remote code only
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_circles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_model_package_imports_only_itself_and_the_torch_free_base():
    graph = import_graph()
    bad = sorted(f"{source} -> {target}" for source, targets in graph.items() if in_package(source, "fullband.model")
                 for target in targets if not any(in_package(target, ok) for ok in MODEL_MAY_IMPORT))
    assert not bad, "the model package imports from outside it: " + ", ".join(bad)


def test_no_layer_imports_from_a_layer_above_it():
    graph = import_graph()
    upward = sorted(f"{source} (layer {layer_of(source)}) -> {target} (layer {layer_of(target)})"
                    for source, targets in graph.items() for target in targets if layer_of(target) > layer_of(source))
    assert not upward, "imports from a higher layer: " + ", ".join(upward)


def outside_docstrings(words: re.Pattern, paths: list[Path]) -> list[str]:
    """``file:line: text`` of every line of ``paths`` (files, or packages searched whole) where ``words`` occur
    outside a docstring (code, strings, help texts, comments)."""
    found = []
    for path in paths:
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            text = file.read_text()
            docstring_lines = {line for node in ast.walk(ast.parse(text))
                               if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                               and node.body and isinstance(node.body[0], ast.Expr)
                               and isinstance(node.body[0].value, ast.Constant)
                               for line in range(node.body[0].lineno, node.body[0].end_lineno + 1)}
            found += [f"{file.relative_to(SRC)}:{number}: {line.strip()}"
                      for number, line in enumerate(text.splitlines(), 1)
                      if number not in docstring_lines and words.search(line)]
    return found


def test_outside_integrations_a_family_is_named_in_docstrings_only():
    # Training, checkpoints, loading, serving, evaluation and the studies call the model-family interface and the
    # families' specs: issue 26's grep for the retrofitted family finds it there in docstrings only. The family
    # table (families/table.py) is where it is named.
    paths = [*(SRC / p for p in ("training", "model", "serve", "experiments", "data", "evaluation")),
             SRC / "families" / "spec.py", SRC / "families" / "loading.py"]
    found = outside_docstrings(re.compile(r"retrofit|hf_retrofit", re.IGNORECASE), paths)
    assert not found, "a family named outside integrations/ and docstrings: " + "; ".join(found)


def test_training_serving_and_data_never_spell_a_source_prefix():
    # Issue 44: the prefix a family builds from ("hf:") is defined once (fullband.config.HF_PREFIX) and a family's
    # spec tests it; training, serving and data use the constant or ask the spec.
    found = outside_docstrings(re.compile(r"hf:"), [SRC / p for p in ("training", "serve", "data")])
    assert not found, "'hf:' spelt outside docstrings: " + "; ".join(found)
    defined = outside_docstrings(re.compile(r"^\s*HF_PREFIX\s*="), [SRC])
    assert len(defined) == 1 and defined[0].startswith("config.py:"), defined  # defined once


def test_decoding_lives_outside_the_model():
    # A fresh interpreter: the model package loads no decoding code, nothing is bound onto a model class when
    # generation is imported, and the public API decodes all the same (generate(model, ...), as nanochat's Engine).
    code = (
        "import sys, torch\n"
        "import fullband.model\n"
        "assert 'fullband.generation' not in sys.modules\n"
        "from fullband import FullBandwidthLM, ModelConfig, generate, stream\n"
        "assert 'fullband.generation.decoding' in sys.modules\n"
        "assert not any(hasattr(cls, name) for cls in FullBandwidthLM.__mro__ for name in ('generate', 'stream', "
        "'bind_decoding'))\n"
        "torch.manual_seed(0)\n"
        "model = FullBandwidthLM(ModelConfig(vocab_size=16, d_model=8, n_layers=1, n_heads=2, max_seq_len=16))\n"
        "ids = generate(model, [1, 2, 3], max_new_tokens=4, mode='soft')\n"
        "assert len(ids) == 7 and ids[:3] == [1, 2, 3], ids\n"
        "assert len(list(stream(model, [1, 2], max_new_tokens=3))) == 3\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
