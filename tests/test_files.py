"""fullband.files: atomic writes (temporary file, fsync, rename) and the one JSON policy, used by every writer."""

import ast
import json
import os
import stat
from pathlib import Path

import pytest

import fullband
from fullband import files


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "state.json"
    files.write_text(path, "old\n")

    def fail(f):
        f.write(b"half of the new")
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError, match="killed"):
        files.write_file(path, fail)
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_the_bytes_are_fsynced_before_the_rename(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append("replace"), real_replace(a, b))[1])
    files.write_bytes(tmp_path / "a.bin", b"\x00\x01")
    files.write_through(tmp_path / "b.bin", lambda p: p.write_bytes(b"\x02"))
    assert events == ["fsync", "replace", "fsync", "replace"]
    assert (tmp_path / "a.bin").read_bytes() == b"\x00\x01" and (tmp_path / "b.bin").read_bytes() == b"\x02"


def test_a_written_file_has_the_permissions_open_gives(tmp_path):
    (tmp_path / "plain").write_text("x")
    files.write_text(tmp_path / "atomic", "x")
    mode = stat.S_IMODE
    assert mode((tmp_path / "atomic").stat().st_mode) == mode((tmp_path / "plain").stat().st_mode)


def test_a_file_written_through_a_path_has_the_permissions_open_gives(tmp_path):
    """safetensors' save_file writes its own temporary file, 0600, and renames it over the path it is given."""

    def private_writer(path: Path) -> None:
        own = path.with_name(path.name + ".own")
        own.write_bytes(b"weights")
        own.chmod(0o600)
        os.replace(own, path)

    (tmp_path / "plain").write_text("x")
    files.write_through(tmp_path / "model.safetensors", private_writer)
    mode = stat.S_IMODE
    assert mode((tmp_path / "model.safetensors").stat().st_mode) == mode((tmp_path / "plain").stat().st_mode)
    assert (tmp_path / "model.safetensors").read_bytes() == b"weights"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors", "plain"]


def test_json_policy_non_finite_numbers_are_null_everywhere_in_the_data(tmp_path):
    data = {"loss": float("nan"), "runs": [{"gap": float("inf")}, (1.5, float("-inf"))], "ok": 2.0, "flag": True}
    files.write_json(tmp_path / "r.json", data)
    text = (tmp_path / "r.json").read_text()
    assert json.loads(text) == {"loss": None, "runs": [{"gap": None}, [1.5, None]], "ok": 2.0, "flag": True}
    assert "NaN" not in text and "Infinity" not in text
    assert files.dumps({"x": float("nan")}, indent=None) == '{"x": null}'  # a JSON line


def test_json_policy_is_the_old_format_for_finite_data(tmp_path):
    # Checkpoints, configs and caches keep their bytes: indent 2 and a final newline (sorted keys where asked).
    data = {"b": [1, 2.5, None], "a": {"c": "é"}}
    files.write_json(tmp_path / "x.json", data)
    files.write_json(tmp_path / "y.json", data, sort_keys=True)
    assert (tmp_path / "x.json").read_text() == json.dumps(data, indent=2) + "\n"
    assert (tmp_path / "y.json").read_text() == json.dumps(data, indent=2, sort_keys=True) + "\n"


def test_json_policy_values_without_a_json_type_are_their_str(tmp_path):
    assert json.loads(files.dumps({"path": tmp_path})) == {"path": str(tmp_path)}
    assert json.loads(files.dumps({"s": {1}}, default=sorted)) == {"s": [1]}


# Writing a file anywhere else in src/ bypasses the atomic write: these calls are what a writer would use.
WRITERS = {"write_text", "write_bytes", "mkstemp", "NamedTemporaryFile", "dump", "savefig"}
APPEND_ONLY = {"training/metrics.py"}  # metrics.jsonl grows a line at a time: appended, never replaced whole


def test_every_writer_in_src_goes_through_fullband_files():
    src = os.path.dirname(fullband.__file__)
    found = []
    for root, _, names in os.walk(src):
        for name in names:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, src)
            if not name.endswith(".py") or rel == "files.py":
                continue
            for node in ast.walk(ast.parse(Path(path).read_text())):
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                attr = func.attr if isinstance(func, ast.Attribute) else None
                owner = func.value.id if attr and isinstance(func.value, ast.Name) else None
                if attr in WRITERS and owner not in ("files",) and not (attr == "savefig" and _in_write_file(node)):
                    found.append(f"{rel}:{node.lineno} .{attr}()")
                if attr == "replace" and owner == "os":
                    found.append(f"{rel}:{node.lineno} os.replace()")
                if isinstance(func, ast.Name) and func.id == "open" and rel not in APPEND_ONLY and _writes(node):
                    found.append(f"{rel}:{node.lineno} open(..., 'w')")
    assert not found, "writes that bypass fullband.files: " + ", ".join(sorted(found))


def _writes(call: ast.Call) -> bool:
    modes = [a for a in call.args[1:2]] + [k.value for k in call.keywords if k.arg == "mode"]
    return any(isinstance(m, ast.Constant) and isinstance(m.value, str) and set(m.value) & set("wax")
               for m in modes)


def _in_write_file(call: ast.Call) -> bool:
    # fig.savefig(f, ...) inside the lambda handed to files.write_file: it writes the temporary file
    return bool(call.args) and isinstance(call.args[0], ast.Name) and call.args[0].id == "f"
