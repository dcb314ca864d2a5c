"""The copy of Lightning's tests that runs under the mirror (bench/lightning_compat.py).

`prepare(checkout, dest)` copies ``tests/tests_pytorch`` and Lightning's demos (as the package
``lightning_demos``) into ``dest`` and rewrites their import paths to ``trainer.lightning``: the
text rule of docs/lightning.md ("change the import lines"), applied to every Lightning path in
the file (imports and the strings of ``mock.patch``). Module-level ``from ... import`` lines of
Lightning names go through ``_ltcompat_shim.lookup`` so that a name the mirror lacks fails only
the tests that use it. The test infrastructure (``conftest.py``, ``helpers/runif.py``: fixtures and
skip conditions) keeps Lightning's imports; its fixtures' patches of Lightning's modules (a mocked CUDA
device count) patch the mirror's same public path too. Nothing is written into this repository.
"""

from __future__ import annotations

import ast
import os
import re
import shutil

#: files kept as Lightning wrote them (fixtures and skip conditions, not the code under test)
KEEP = {"conftest.py", os.path.join("helpers", "runif.py")}

_PATH = re.compile(
    r"(?<![\w.])(?:(lightning\.pytorch\.demos|pytorch_lightning\.demos)"
    r"|(lightning\.pytorch|pytorch_lightning)"
    r"|(lightning\.fabric|lightning_fabric)"
    r"|(lightning)(?=\.\w|\s+import\b|\s+as\b|\s*$|\s*,))(?![\w])",
    re.M,
)


def rewrite_text(text: str) -> str:
    """Every Lightning module path in ``text`` as the mirror's."""

    def replace(match: re.Match) -> str:
        demos, pytorch, fabric, bare = match.groups()
        if demos:
            return "lightning_demos"
        if fabric:
            return "trainer.lightning.fabric"
        return "trainer.lightning"

    return _PATH.sub(replace, text)


def lightning_module(module: str) -> str:
    """Lightning's path of a rewritten module path (for messages and classification)."""
    if module.startswith("lightning_demos"):
        return module.replace("lightning_demos", "lightning.pytorch.demos", 1)
    if module.startswith("trainer.lightning.fabric"):
        return module.replace("trainer.lightning.fabric", "lightning.fabric", 1)
    return module.replace("trainer.lightning", "lightning.pytorch", 1)


def wrap_module_imports(text: str) -> str:
    """Module-level ``from <mirror path> import a, b as c`` -> ``a = _ltc_lookup(...)`` lines."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    lines = text.splitlines(keepends=True)
    edits = []
    for node in tree.body:
        if not (isinstance(node, ast.ImportFrom) and node.module and node.level == 0):
            continue
        if not (node.module.startswith("trainer.lightning") or node.module.startswith("lightning_demos")):
            continue
        if any(alias.name == "*" for alias in node.names):
            continue
        assigns = [
            f"{alias.asname or alias.name} = _ltc_lookup({node.module!r}, {alias.name!r}, "
            f"{lightning_module(node.module) + '.' + alias.name!r})\n"
            for alias in node.names
        ]
        edits.append((node.lineno - 1, node.end_lineno, "".join(assigns)))
    if not edits:
        return text
    for start, end, replacement in reversed(edits):
        lines[start:end] = [replacement]
    header = "from _ltcompat_shim import lookup as _ltc_lookup\n"
    future = [i for i, line in enumerate(lines) if line.startswith("from __future__")]
    at = future[-1] + 1 if future else 0
    lines.insert(at, header)
    return "".join(lines)


_FIXTURE_PATCH = re.compile(r"^([ \t]*)monkeypatch\.setattr\((lightning\.[\w.]+),\s*(\"\w+\"),\s*(.+)\)[ \t]*$", re.M)


def mirror_fixture_patches(text: str) -> str:
    """A kept file's ``monkeypatch.setattr(lightning.<path>, "name", value)`` lines (the fixtures that mock
    the machine: ``mock_cuda_count``) also patch the mirror's same public path, where the mirror has that
    attribute (``_ltcompat_shim.mirror_setattr``); Lightning's own patch stays."""

    def add(match: re.Match) -> str:
        indent, target, name, value = match.groups()
        mirrored = rewrite_text(target)
        return (f"{match.group(0)}\n{indent}_ltc_mirror_setattr(monkeypatch, {mirrored!r}, {name}, {value})")

    patched = _FIXTURE_PATCH.sub(add, text)
    if patched == text:
        return text
    return "from _ltcompat_shim import mirror_setattr as _ltc_mirror_setattr\n" + patched


def prepare(checkout: str, dest: str, rewrite: bool = True) -> str:
    """Copy Lightning's tests and demos under ``dest`` (rewritten when ``rewrite``); returns ``dest``, the
    folder pytest runs in."""
    source = os.path.join(checkout, "tests", "tests_pytorch")
    demos = os.path.join(checkout, "src", "lightning", "pytorch", "demos")
    if os.path.exists(dest):
        shutil.rmtree(dest)
    shutil.copytree(source, os.path.join(dest, "tests_pytorch"))
    shutil.copytree(demos, os.path.join(dest, "lightning_demos"))
    shutil.copy(os.path.join(checkout, "pyproject.toml"), dest)  # Lightning's pytest settings, for both runs
    shutil.copy(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_lightning_compat_shim.py"),
                os.path.join(dest, "_ltcompat_shim.py"))
    if not rewrite:
        shutil.rmtree(os.path.join(dest, "lightning_demos"))
        return dest
    for root, _, files in os.walk(dest):
        for name in files:
            path = os.path.join(root, name)
            relative = os.path.relpath(path, os.path.join(dest, "tests_pytorch"))
            if not name.endswith(".py") or name == "_ltcompat_shim.py":
                continue
            with open(path) as f:
                text = f.read()
            rewritten = mirror_fixture_patches(text) if relative in KEEP else wrap_module_imports(rewrite_text(text))
            if rewritten != text:
                with open(path, "w") as f:
                    f.write(rewritten)
    return dest
