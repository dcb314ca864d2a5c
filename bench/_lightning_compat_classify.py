"""Which of Lightning's tests reach into Lightning's internals, and what kind of failure each other one
is (bench/lightning_compat.py).

Internal (not counted): the test, or a class or function of its file that it uses, reads or patches
a name starting with ``_`` that Lightning defines, a ``*_loop`` / ``*_connector`` / ``strategy`` /
``accelerator`` / ``precision_plugin`` attribute of the Trainer, or a Lightning module path outside
the public ones the mirror offers; or its failure under the mirror is such a module or name.

A counted failure is one of: ``documented difference`` (its error matches a row of `DIFFERENCES`),
``refusal`` (a ValueError / TypeError / NotImplementedError / RuntimeError raised by a ``raise``
statement of this trainer), ``missing name`` (ImportError / AttributeError, an unexpected keyword argument), ``wrong result``
(everything else: an assertion, a warning not given, a crash).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
import re

#: (regex on the failure text, the difference docs/lightning.md documents)
DIFFERENCES = [
    (r"step-\d+", "checkpoints are step-<S>/ folders, not epoch=E-step=S.ckpt files"),
]

_TRAINER_INTERNALS = re.compile(
    r"trainer\)?\.(\w+_loop|\w+_connector|strategy|accelerator|precision_plugin)\b"
    r"|patch\.object\(\s*\w*trainer\w*\s*,\s*[\"'](\w+_loop|\w+_connector|strategy|accelerator|precision_plugin)[\"']"
)
_PRIVATE_ATTRIBUTE = re.compile(r"(\w+)\.(_[a-zA-Z]\w*)\b")
_PRIVATE_STRING = re.compile(r"[\"']((?:lightning|pytorch_lightning)\.[\w.]+)[\"']")
_IMPORT_FROM = re.compile(r"^\s*from\s+((?:lightning|pytorch_lightning)(?:\.[\w.]+)?)\s+import\s+(\([^)]*\)|[\w ,]+)", re.M)
_ENVIRONMENT_FLAG = re.compile(r"^_\w*(GREATER_EQUAL|_GE_|_AVAILABLE|_IS_WINDOWS|_LESS)")
_MIRROR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "trainer", "lightning")


@functools.lru_cache(maxsize=None)
def lightning_private_names() -> frozenset[str]:
    """The ``_names`` Lightning's own classes define (attributes and methods), from its installed source."""
    spec = importlib.util.find_spec("lightning")
    if spec is None or spec.origin is None:
        return frozenset()
    root = os.path.dirname(spec.origin)
    names: set[str] = set()
    pattern = re.compile(r"self\.(_[a-zA-Z]\w*)\s*[:=]|def (_[a-zA-Z]\w*)\(")
    for sub in ("pytorch", "fabric"):
        for folder, _, files in os.walk(os.path.join(root, sub)):
            for name in files:
                if name.endswith(".py"):
                    with open(os.path.join(folder, name), encoding="utf-8") as f:
                        names.update(a or b for a, b in pattern.findall(f.read()))
    return frozenset(names)


def mirror_module_exists(lightning_module: str) -> bool:
    """Is Lightning's module path one the mirror offers (a file or package under trainer/lightning)?"""
    parts = lightning_module.split(".")
    if parts[0] == "pytorch_lightning":
        parts = parts[1:]
    elif parts[:2] in (["lightning", "pytorch"],):
        parts = parts[2:]
    elif parts[:2] == ["lightning", "fabric"]:
        parts = ["fabric"] + parts[2:]
    else:
        parts = parts[1:]
    if parts[:1] == ["demos"]:  # Lightning's demos run rewritten
        return True
    path = os.path.join(_MIRROR, *parts)
    return not parts or os.path.isdir(path) or os.path.isfile(path + ".py")


def _module_of(dotted: str) -> tuple[str, list[str]]:
    """Split ``lightning.pytorch.a.b.Name.attr`` into the longest importable Lightning module and the rest."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        try:
            if importlib.util.find_spec(module) is not None:
                return module, parts[cut:]
        except (ImportError, ValueError):
            continue
    return parts[0], parts[1:]


def path_is_internal(dotted: str) -> bool:
    """A Lightning path (module, or module plus names) that is private or outside the mirror's modules."""
    module, rest = _module_of(dotted)
    return any(p.startswith("_") for p in module.split(".") + rest) or not mirror_module_exists(module)


class SourceIndex:
    """One test file's source: what a test (and the file's classes and functions it uses) contains."""

    def __init__(self, path: str):
        with open(path, encoding="utf-8") as f:
            self.text = f.read()
        self.tree = ast.parse(self.text)
        self.top = {node.name: node for node in self.tree.body
                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        self.own_private = set(re.findall(r"self\.(_[a-zA-Z]\w*)\s*[:=]", self.text))
        self.imports = {}
        for module, names in _IMPORT_FROM.findall(self.text):
            for name in re.split(r"[\s,()]+", names):
                if name and name != "as":
                    self.imports[name] = f"{module}.{name}"

    def _node(self, test: str) -> ast.AST | None:
        parts = test.split("[")[0].split("::")
        node = self.top.get(parts[0])
        for part in parts[1:]:
            if node is None:
                return None
            node = next((n for n in getattr(node, "body", []) if getattr(n, "name", None) == part), None)
        return node

    def source(self, test: str) -> str:
        """The test's source with the file's top-level classes and functions it names (transitively)."""
        node = self._node(test)
        if node is None:
            return ""
        seen, todo, chunks = set(), [node], []
        while todo:
            current = todo.pop()
            if id(current) in seen:
                continue
            seen.add(id(current))
            chunks.append(self._segment(current))
            for name in {n.id for n in ast.walk(current) if isinstance(n, ast.Name)}:
                if name in self.top:
                    todo.append(self.top[name])
        return "\n".join(chunks)

    def _segment(self, node: ast.AST) -> str:
        """A definition's source with its decorators (``@patch("lightning...")`` is part of the test)."""
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        return "".join(self.text.splitlines(keepends=True)[first - 1:node.end_lineno])

    def internal_reason(self, test: str) -> str | None:
        """Why the test is internal, or None."""
        source = self.source(test)
        match = _TRAINER_INTERNALS.search(source)
        if match:
            return f"Trainer attribute {next(g for g in match.groups() if g)}"
        private = lightning_private_names()
        for owner, name in _PRIVATE_ATTRIBUTE.findall(source):
            if name in private and not (owner == "self" and name in self.own_private):
                return f"private name {owner}.{name}"
        for dotted in _PRIVATE_STRING.findall(source):
            if path_is_internal(dotted):
                return f"private path {dotted}"
        used = {n for n in re.findall(r"\b\w+\b", source)}
        for name, dotted in self.imports.items():
            if _ENVIRONMENT_FLAG.search(name):  # a version / platform flag of a skip condition, not the code tested
                continue
            if name in used and (name.startswith("_") or path_is_internal(dotted.rsplit(".", 1)[0])):
                return f"imports {dotted}"
        return None


_LAST_ERROR = re.compile(r"^E\s+(\w[\w.]*(?:Error|Exception|Exit|Interrupt|Warning|Failed|Unavailable)\b)?:?\s*(.*)$", re.M)


def error_line(text: str) -> tuple[str, str]:
    """(exception type, message) of a pytest failure text: its first ``E`` line that names an exception."""
    for kind, message in _LAST_ERROR.findall(text):
        if kind:
            return kind.split(".")[-1], message.strip()
    lines = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
    if lines:
        return "AssertionError", lines[0]
    return "Error", (text.strip().splitlines() or [""])[-1]


def classify_failure(text: str, repo: str, root: str) -> tuple[str, str]:
    """(class, cause) of a counted test's failure text under the mirror (``internal`` when it shows one);
    ``repo`` is this repository, ``root`` the folder the test ran in."""
    kind, message = error_line(text)
    cause = re.sub(r"0x[0-9a-f]+|\d+(\.\d+)?", "N", f"{kind}: {message}")[:160]
    unavailable = re.search(r"\[ltcompat-unavailable\] ([\w.]+): (\w+)", text)
    if unavailable:
        name = unavailable.group(1)
        if path_is_internal(name) or unavailable.group(2) == "ModuleNotFoundError":
            return "internal", f"uses {name}"
        return "missing name", f"{name} missing"
    missing_attribute = re.search(r"module 'trainer\.lightning((?:\.\w+)*)' has no attribute '(\w+)'", text)
    if missing_attribute and path_is_internal(f"lightning.pytorch{missing_attribute.group(1)}.{missing_attribute.group(2)}"
                                              .replace("lightning.pytorch.fabric", "lightning.fabric")):
        return "internal", cause
    missing_module = re.search(r"(lightning\.[\w.]+) \(Lightning's\) does not exist", text)
    if kind == "ModuleNotFoundError" or (missing_module and path_is_internal(missing_module.group(1))):
        return "internal", cause
    for pattern, difference in DIFFERENCES:
        if re.search(pattern, text):
            return "documented difference", difference
    if kind in ("ImportError", "AttributeError") or (kind == "TypeError" and "unexpected keyword argument" in message):
        return "missing name", cause
    frames = re.findall(r"^(\S+\.py):\d+: in \w+\n((?:    .*\n)+)", text, re.M)
    if frames:
        path, code = frames[-1]
        ours = os.path.normpath(os.path.join(root, path)).startswith(os.path.join(repo, "trainer") + os.sep)
        if ours and code.strip().startswith("raise") and kind in (
                "ValueError", "TypeError", "NotImplementedError", "RuntimeError", "MisconfigurationException",
                "KeyError", "CheckpointError"):
            return "refusal", cause
    return "wrong result", cause
