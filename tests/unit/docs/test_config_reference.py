"""docs/reference/configuration.md is what docs/gen_config_reference.py writes from today's conf/, and
that script reads every key of every file, with its default as yaml reads it and a meaning."""

import importlib.util
import os
import shutil
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _generator():
    spec = importlib.util.spec_from_file_location("gen_config_reference", os.path.join(ROOT, "docs", "gen_config_reference.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up there)
    spec.loader.exec_module(module)
    return module


gen = _generator()
YAML_FILES = sorted(os.path.relpath(os.path.join(d, f), os.path.join(ROOT, "conf"))
                    for d, _, files in os.walk(os.path.join(ROOT, "conf")) for f in files if f.endswith(".yaml"))


def _leaves(node, prefix=""):
    """Dotted key -> value of every key yaml reads (a mapping's keys, not the mapping itself)."""
    out = {}
    for key, value in node.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_leaves(value, path + "."))
        else:
            out[path] = value
    return out


def test_the_checked_in_page_is_what_the_script_writes_from_conf():
    with open(gen.PAGE) as handle:
        page = handle.read()
    assert page == gen.render(), "stale: run python docs/gen_config_reference.py"
    assert gen.main(["--check"]) == 0


@pytest.mark.parametrize("name", YAML_FILES)
def test_every_key_of_every_file_is_read_with_its_default_and_a_meaning(name):
    path = os.path.join(ROOT, "conf", name)
    with open(path) as handle:
        loaded = yaml.safe_load(handle)
    loaded.pop("defaults", None)
    want = _leaves(loaded)
    parsed = gen.parse(path)
    rows = {row.key: row for row in parsed.items if isinstance(row, gen.Row) and not row.section}
    assert set(rows) == set(want), name
    base_keys = gen.base_key_set(gen.parse(os.path.join(ROOT, "conf", "config.yaml")))
    for key, value in want.items():
        assert yaml.safe_load(rows[key].default) == value, (name, key)  # the page shows what yaml reads
        assert gen.meaning_of(rows[key], base_keys), f"conf/{name}: {key} has no comment saying what it means"


def test_a_changed_comment_or_a_new_key_makes_the_page_stale(tmp_path):
    conf = tmp_path / "conf"
    shutil.copytree(os.path.join(ROOT, "conf"), conf)
    ddp = conf / "strategy" / "ddp.yaml"
    ddp.write_text(ddp.read_text() + "new_knob: 7       # a knob added | for the test\n")
    page = gen.render(str(conf))
    assert page != gen.render()
    assert "| `strategy.new_knob` | `7` | a knob added \\| for the test |" in page.splitlines()


def test_continued_comments_notes_and_quoted_hashes(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text(
        "# What this file is.\n#   python train.py x=1\n"
        "a:\n  b: \"#not a comment\"  # the meaning\n" + " " * 23 + "# goes on here\n"
        "  # a note between keys\n  c: 1\n")
    parsed = gen.parse(str(path))
    assert parsed.description == ["What this file is.", "  python train.py x=1"]
    rows = [item for item in parsed.items if isinstance(item, gen.Row)]
    assert [(r.key, r.default, r.meaning) for r in rows] == [
        ("a", "", ""), ("a.b", '"#not a comment"', "the meaning goes on here"), ("a.c", "1", "")]
    assert [item.text for item in parsed.items if isinstance(item, gen.Note)] == [["a note between keys"]]
