"""A Lightning program ported the way a user ports it: its import lines changed, nothing else.

:func:`rewrite_imports` changes the module names of the import statements that name ``lightning``,
``lightning.pytorch`` or ``pytorch_lightning`` (at any depth: imports inside functions too) to
``trainer.lightning``; every other line, and every other part of an import line, stays as written.
Imports that bind the package's own dotted name (``import lightning.pytorch`` without ``as``) cannot
be ported without changing the lines that use that name and are refused.

:class:`RewritingFinder` serves the programs of a package, rewritten, under another package's name
(tests/support/lightning_as_ours/), so that spawned ranks that unpickle a program's class import the
rewritten program too.
"""

from __future__ import annotations

import ast
import importlib.abc
import importlib.util
import os
import re
import sys

#: the package the ported programs import instead of Lightning
TARGET = "trainer.lightning"

#: Lightning's package names, most specific first (``lightning.pytorch`` before ``lightning``)
_SOURCES = ("lightning.pytorch", "pytorch_lightning", "lightning")


def _ported_name(name: str) -> str | None:
    """``lightning.pytorch.callbacks`` -> ``trainer.lightning.callbacks``; None for other packages."""
    for source in _SOURCES:
        if name == source or name.startswith(source + "."):
            return TARGET + name[len(source):]
    return None


def _rewrite_statement(text: str, node: ast.Import | ast.ImportFrom) -> str:
    """The import statement's source ``text`` with its Lightning module names replaced."""
    if isinstance(node, ast.ImportFrom):
        if node.level or node.module is None or _ported_name(node.module) is None:
            return text
        pattern = re.compile(r"(\bfrom\s+)" + re.escape(node.module) + r"(?=\s)")
        new, count = pattern.subn(lambda m: m.group(1) + _ported_name(node.module), text, count=1)
        assert count == 1, text
        return new
    for alias in node.names:
        ported = _ported_name(alias.name)
        if ported is None:
            continue
        if alias.asname is None and "." in alias.name:
            raise ValueError(f"cannot port {text.strip()!r} by its import line alone (the code names "
                             f"{alias.name.split('.')[0]}.{alias.name.split('.', 1)[1]}): write "
                             f"'import {alias.name} as NAME'")
        # ``import lightning`` binds ``lightning``: keep that name bound
        replacement = ported if alias.asname is not None else f"{ported} as {alias.name}"
        pattern = re.compile(r"(?<![\w.])" + re.escape(alias.name) + r"(?![\w.])")
        text, count = pattern.subn(replacement, text, count=1)
        assert count == 1, text
    return text


def rewrite_imports(source: str) -> str:
    """``source`` with the module names of its Lightning import statements changed to
    :data:`TARGET`; every other character as it was."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    statements = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    # From the last statement back, so earlier positions stay valid.
    for node in sorted(statements, key=lambda n: (n.lineno, n.col_offset), reverse=True):
        first, last = node.lineno - 1, node.end_lineno - 1
        span = "".join(lines[first:last + 1])
        end = len(span) - (len(lines[last]) - node.end_col_offset)
        statement = span[node.col_offset:end]
        new = _rewrite_statement(statement, node)
        if new != statement:
            lines[first:last + 1] = [span[:node.col_offset] + new + span[end:]]
    return "".join(lines)


class RewritingFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``<alias_package>.<name>`` as ``<source_directory>/<name>.py`` with its imports rewritten."""

    def __init__(self, alias_package: str, source_directory: str):
        self.alias_package, self.source_directory = alias_package, source_directory

    def find_spec(self, fullname, path=None, target=None):
        prefix = self.alias_package + "."
        if not fullname.startswith(prefix) or "." in fullname[len(prefix):]:
            return None
        origin = os.path.join(self.source_directory, fullname[len(prefix):] + ".py")
        if not os.path.isfile(origin):
            return None
        return importlib.util.spec_from_loader(fullname, self, origin=origin)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        with open(module.__spec__.origin) as f:
            source = rewrite_imports(f.read())
        module.__file__ = module.__spec__.origin
        exec(compile(source, module.__spec__.origin, "exec"), module.__dict__)


def install(alias_package: str, source_directory: str) -> None:
    """Add a :class:`RewritingFinder` for ``alias_package`` to ``sys.meta_path`` (once)."""
    for finder in sys.meta_path:
        if isinstance(finder, RewritingFinder) and finder.alias_package == alias_package:
            return
    sys.meta_path.insert(0, RewritingFinder(alias_package, source_directory))
