"""Write docs/reference/configuration.md from conf/: every group, option, key, default and meaning.

    python docs/gen_config_reference.py           # rewrite the page
    python docs/gen_config_reference.py --check   # exit 1 when the page is not what conf/ gives today

The meanings are the yaml files' own comments: a key's trailing comment (and the comment lines
that continue it, aligned under it), a file's leading comment as the option's description, and a
comment block between keys as a note where it stands. Defaults are shown as written in the file
(``${...}`` interpolations unresolved). Nothing here is edited by hand: change the comment in conf/
and run the script.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONF = os.path.join(ROOT, "conf")
PAGE = os.path.join(ROOT, "docs", "reference", "configuration.md")

#: the primary configs that are not the training config, and the command that reads each
TOOL_CONFIGS = {"estimate.yaml": "trainer estimate", "dry_run.yaml": "trainer dry-run", "autotune.yaml": "trainer autotune"}
KEY = re.compile(r"^(\s*)([A-Za-z_][\w\-.]*):(?:\s+(.*))?$")  # dotted: a sweeper's params (optimizer.lr: ...)
COMMANDS = ("python ", "trainer ", "torchrun ", "srun ")  # a description line starting so is an example
DEFAULTS_ENTRY = re.compile(r"^\s*-\s+(?:override\s+/?)?([\w/@\-]+)(?::\s*(.*))?$")


@dataclass
class Row:
    """One key of a yaml file: its dotted path, the default as written, its meaning."""

    key: str
    default: str
    meaning: str
    section: bool = False  # a mapping whose keys follow


@dataclass
class Note:
    """A comment block standing between keys."""

    text: list[str]


@dataclass
class Parsed:
    """A yaml file read line by line: its description, defaults list, keys and notes in file order."""

    description: list[str] = field(default_factory=list)
    global_package: bool = False
    defaults: list[Row] = field(default_factory=list)
    items: list[Row | Note] = field(default_factory=list)


def split_comment(line: str) -> tuple[str, str | None, int]:
    """``(code, comment or None, the comment's column)``; a ``#`` inside quotes is not a comment."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            if char == quote:
                quote = None
        elif char in "\"'":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1:].strip(), i
    return line.rstrip(), None, -1


def parse(path: str) -> Parsed:
    """Read ``path``'s keys with their comments (the yaml files in conf/ are block style throughout)."""
    with open(path) as handle:
        lines = handle.read().splitlines()
    parsed = Parsed()
    i = 0
    while i < len(lines) and lines[i].lstrip().startswith("#"):  # the leading comment: the description
        column = split_comment(lines[i])[2]
        raw = lines[i][column + 1:].removeprefix(" ").rstrip()  # indentation kept: it marks example commands
        if raw.strip() == "@package _global_":
            parsed.global_package = True
        else:
            parsed.description.append(raw)
        i += 1
    stack: list[tuple[int, str]] = []  # (indent, key) of the mappings the current line is inside
    last: Row | None = None  # the row whose trailing comment a comment-only line may continue
    last_column = -1
    in_defaults = False
    pending: list[str] = []
    for line in lines[i:]:
        code, comment, column = split_comment(line)
        if not code.strip():
            if comment is None:  # a blank line ends a comment block and a continuation
                last = None
                continue
            if last is not None and column == last_column:
                last.meaning += " " + comment
                continue
            last = None
            pending.append(line[column + 1:].removeprefix(" "))
            continue
        if pending:
            parsed.items.append(Note(pending))
            pending = []
        indent = len(code) - len(code.lstrip())
        if in_defaults and indent == 0 and not code.lstrip().startswith("-"):
            in_defaults = False
        if in_defaults:
            entry = DEFAULTS_ENTRY.match(code)
            if entry is None:
                raise ValueError(f"{path}: a defaults entry this script cannot read: {line!r}")
            group, option = entry.group(1), entry.group(2)
            if option is not None:  # "- group: option" (plain names are other configs or _self_)
                last = Row(group, option, comment or "")
                last_column = column
                parsed.defaults.append(last)
            continue
        match = KEY.match(code)
        if match is None:
            raise ValueError(f"{path}: a line this script cannot read: {line!r}")
        key, value = match.group(2), (match.group(3) or "").strip()
        if indent == 0 and key == "defaults":
            in_defaults = True
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        dotted = ".".join([k for _, k in stack] + [key])
        last = Row(dotted, value, comment or "", section=not value)
        last_column = column
        parsed.items.append(last)
        if not value:
            stack.append((indent, key))
    if pending:
        parsed.items.append(Note(pending))
    return parsed


# ----- rendering ----------------------------------------------------------------------------------
def text(words: str) -> str:
    """Comment text as Markdown that shows it as written (inside a table cell)."""
    out = []
    for part in re.split(r"(`[^`]*`)", words):
        if part.startswith("`") and part.endswith("`") and len(part) > 1:
            out.append(part)
            continue
        part = re.sub(r"([\\*_\[\]|])", r"\\\1", part)
        out.append(part.replace("<", "&lt;").replace(">", "&gt;"))
    return "".join(out)


def code(value: str) -> str:
    """A default as inline code (``|`` escaped for the table)."""
    return f"`{value}`".replace("|", "\\|") if value else ""


def description(lines: list[str]) -> list[str]:
    """A file's leading comment: prose as a paragraph, its indented command lines as a text block."""
    out: list[str] = []
    prose: list[str] = []
    commands: list[str] = []

    def flush() -> None:
        if prose:
            out.extend([text(" ".join(prose)), ""])
            prose.clear()
        if commands:
            out.extend(["```text", *commands, "```", ""])
            commands.clear()

    for line in lines:
        if line.startswith("  ") or line.startswith(COMMANDS):  # "#   python train.py ...": an example command
            if prose:
                flush()
            commands.append(line.strip())
        else:
            if commands:
                flush()
            prose.append(line.strip())
    flush()
    return out


def note(lines: list[str]) -> list[str]:
    """A comment block between keys: prose, then (when it shows yaml) the yaml as a block."""
    for i, line in enumerate(lines):
        if KEY.match(line.split("  #")[0].rstrip()):
            prose, example = lines[:i], lines[i:]
            break
    else:
        prose, example = lines, []
    out = [f"*{text(' '.join(p.strip() for p in prose))}*", ""] if prose else []
    if example:
        indent = min(len(x) - len(x.lstrip()) for x in example if x.strip())
        out.extend(["```yaml", *(x[indent:] for x in example), "```", ""])
    return out


def table(rows: list[Row], prefix: str, base_keys: frozenset[str] = frozenset()) -> list[str]:
    """Rows as a Markdown table; a mapping without a comment of its own is left out (its keys are there)."""
    out = ["| key | default | meaning |", "| --- | --- | --- |"]
    for row in rows:
        if row.section and not row.meaning:
            continue
        key = f"{prefix}{row.key}" if prefix else row.key
        default = "(a group of keys)" if row.section else code(row.default)
        meaning = text(row.meaning) if row.meaning else meaning_of(row, base_keys)
        out.append(f"| `{key}` | {default} | {meaning} |")
    return out + [""]


def meaning_of(row: Row, base_keys: frozenset[str] = frozenset()) -> str:
    """A key's meaning where its file has no comment for it: Hydra's keys, an interpolation, a recipe's
    value of a key documented in the base configs; else empty (the test asks for a comment)."""
    if row.meaning:
        return text(row.meaning)
    last = row.key.rsplit(".", 1)[-1]
    follows = re.fullmatch(r"\$\{([\w.]+)\}", row.default)
    if follows:
        return f"the value of `{follows.group(1)}`"
    if last == "_target_":
        return "the class or function this config builds (Hydra)"
    if last == "_partial_":
        return "built as a partial: the trainer calls it with the remaining arguments (Hydra)"
    if row.key in base_keys:
        return "this option's value of the key above (its meaning there)"
    return ""


def items(parsed: Parsed, prefix: str, override_note: bool = True, base_keys: frozenset[str] = frozenset()) -> list[str]:
    """The keys of a file as tables, with its notes between them where they stand."""
    out: list[str] = []
    if parsed.defaults and override_note:
        out.extend(["Selects these options of other groups:", "", "| group | option | why |", "| --- | --- | --- |"])
        out.extend(f"| `{d.key}` | `{d.default}` | {text(d.meaning)} |" for d in parsed.defaults)
        out.append("")
    rows: list[Row] = []
    for item in parsed.items:
        if isinstance(item, Note):
            if rows:
                out.extend(table(rows, prefix, base_keys))
                rows = []
            out.extend(note(item.text))
        else:
            rows.append(item)
    if rows:
        out.extend(table(rows, prefix, base_keys))
    return out


def base_key_set(base: Parsed) -> frozenset[str]:
    """The keys of the base config and of the trainer group's default: a recipe's keys that repeat one
    of these set it for that recipe."""
    keys = {row.key for row in base.items if isinstance(row, Row)}
    for option in group_options("trainer"):
        keys |= {f"trainer.{row.key}" for row in parse(os.path.join(CONF, "trainer", option + ".yaml")).items
                 if isinstance(row, Row)}
    return frozenset(keys)


def group_options(group: str) -> list[str]:
    return sorted(name[:-5] for name in os.listdir(os.path.join(CONF, group)) if name.endswith(".yaml"))


def render(conf: str | None = None) -> str:
    """The page, from the yaml files under ``conf`` (default: the repository's conf/)."""
    global CONF
    saved, CONF = CONF, conf or CONF
    try:
        return _render()
    finally:
        CONF = saved


def _render() -> str:
    base = parse(os.path.join(CONF, "config.yaml"))
    base_keys = base_key_set(base)
    groups = [row for row in base.defaults]
    known = {row.key for row in groups}
    # a config group is a folder of yaml files (not __pycache__, which the package's conf/__init__.py brings)
    # hydra/sweeper, hydra/launcher: Hydra's own groups, one folder down
    folders = [d for d in os.listdir(CONF) if os.path.isdir(os.path.join(CONF, d))]
    folders += [f"{d}/{sub}" for d in folders for sub in os.listdir(os.path.join(CONF, d))
                if os.path.isdir(os.path.join(CONF, d, sub))]
    extra = sorted(d for d in folders if d not in known and group_options(d))
    out = [
        "<!-- Generated by docs/gen_config_reference.py from conf/: edit the yaml comments there and run",
        "     python docs/gen_config_reference.py (a test fails when this page differs from what it writes). -->",
        "# Configuration reference",
        "",
        "Every config group, option and key of the built-in configs (`conf/` in the repository, shipped",
        "inside the package), with its default and its meaning, taken from the files themselves.",
        "A key is set on the command line as `key=value` (`trainer.max_steps=500`), a group's option",
        "as `group=option` (`strategy=fsdp`), a list group as `logger=[jsonl,csv]`; the same overrides",
        "work for `trainer`, `python -m trainer` and `python train.py` in a checkout. Defaults are shown",
        "as written in the files: `${...}` is an interpolation (`${trainer.max_steps}` takes that key's",
        "value), `???` a value that must be given (a recipe gives it), `null` unset.",
        "",
        "## Config groups",
        "",
        "The training config (`conf/config.yaml`) composes one option of each group, in this order; later",
        "ones override earlier ones (a recipe may select options of the groups before it).",
        "",
        "| group | default | options | meaning |",
        "| --- | --- | --- | --- |",
    ]
    for row in groups:
        options = ", ".join(f"`{o}`" for o in group_options(row.key))
        out.append(f"| [`{row.key}`](#{row.key}) | {code(row.default)} | {options} | {text(row.meaning)} |")
    for name in extra:
        options = ", ".join(f"`{o}`" for o in group_options(name))
        out.append(f"| [`{name}`](#{name.replace('/', '')}) | | {options} | |")
    out.extend(["", "## Base keys", "", "`conf/config.yaml`: the keys every run has; recipes fill `module` and may add `data` keys.", ""])
    out.extend(description(base.description))
    out.extend(items(base, "", override_note=False))
    for group in [row.key for row in groups] + extra:
        out.extend([f"## {group}", ""])
        for option in group_options(group):
            parsed = parse(os.path.join(CONF, group, option + ".yaml"))
            prefix = "" if parsed.global_package else f"{group.replace('/', '.')}."
            out.extend([f"### {group}={option}", "", f"`conf/{group}/{option}.yaml`"
                        + (" (its keys are top-level keys of the config)" if parsed.global_package else ""), ""])
            out.extend(description(parsed.description))
            out.extend(items(parsed, prefix, base_keys=base_keys if parsed.global_package else frozenset()))
    out.extend(["## Tools' configs", "", "The planning tools compose the training config and add a block of their own,",
                "which only they read.", ""])
    for name, command in TOOL_CONFIGS.items():
        parsed = parse(os.path.join(CONF, name))
        out.extend([f"### {name[:-5]}", "", f"`conf/{name}`, read by `{command}`.", ""])
        out.extend(description(parsed.description))
        out.extend(items(parsed, "", override_note=False))
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the page differs from what conf/ gives")
    args = parser.parse_args(argv)
    page = render()
    if args.check:
        with open(PAGE) as handle:
            if handle.read() != page:
                print(f"{os.path.relpath(PAGE, ROOT)} is stale: run python docs/gen_config_reference.py", file=sys.stderr)
                return 1
        return 0
    os.makedirs(os.path.dirname(PAGE), exist_ok=True)
    with open(PAGE, "w") as handle:
        handle.write(page)
    print(f"wrote {os.path.relpath(PAGE, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
