"""``trainer init DIR``: write a runnable project of one's own from ``project_template/``.

The project is a package named after ``DIR`` (a model and a DataModule), its ``conf/`` (one
experiment: ``recipe/<name>.yaml``), a test and a README with its two
commands. The ``trainer`` command, run in ``DIR``, finds the package and the configs (project_dir.py).
"""

from __future__ import annotations

import argparse
import keyword
import re
import sys
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parent / "project_template"
PLACEHOLDER = "__NAME__"
SUFFIX = ".tmpl"


def package_name(directory: Path) -> str:
    """A Python package name from the directory's name (``my-project`` -> ``my_project``)."""
    name = re.sub(r"\W+", "_", directory.resolve().name.lower()).strip("_")
    if not name:
        raise ValueError(f"{directory}: cannot make a Python package name from the folder's name; name it with letters")
    if name[0].isdigit():
        name = f"project_{name}"
    # A name Python or this package already uses would import theirs instead of the project's.
    if keyword.iskeyword(name) or name in sys.stdlib_module_names or name in ("trainer", "tests", "conf"):
        name = f"{name}_project"
    return name


def project_files(name: str) -> dict[str, str]:
    """Relative path -> content of every file the project gets."""
    files = {}
    for source in sorted(TEMPLATE.rglob("*" + SUFFIX)):
        relative = source.relative_to(TEMPLATE).as_posix()[: -len(SUFFIX)]
        relative = relative.replace("package/", f"{name}/", 1).replace("NAME", name)
        files[relative] = source.read_text(encoding="utf-8").replace(PLACEHOLDER, name)
    return files


def init_project(directory: Path) -> list[Path]:
    """Write the project into ``directory`` (new, or empty). Returns the files written.

    Raises FileExistsError naming the files that are there already (nothing is overwritten)."""
    name = package_name(directory)
    files = project_files(name)
    clashes = [relative for relative in files if (directory / relative).exists()]
    if clashes:
        raise FileExistsError(f"{directory}: {', '.join(clashes)} exist already; give a new or empty folder")
    written = []
    for relative, text in files.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="trainer init", description="Start a project of your own in DIR.")
    parser.add_argument("directory", metavar="DIR", help="the project's folder (new, or without the files it gets)")
    args = parser.parse_args(argv)
    directory = Path(args.directory)
    try:
        written = init_project(directory)
    except (FileExistsError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    name = package_name(directory)
    print(f"wrote {len(written)} files to {directory}/. Then:\n  cd {directory}\n"
          f"  trainer recipe={name}          # train (outputs/ holds the run)\n"
          f"  python -m pytest tests         # test")
    return 0
