"""The documentation site builds with ``mkdocs build --strict`` (a broken link, a page missing from the
nav or a docstring mkdocstrings cannot render fails it), and its API pages read as written: the docstrings
are parsed as Google style (the Trainer's arguments are rows of its parameters table, one per argument)
and no Sphinx role (``:class:`X```) is left as literal text. One build per session, shared by the tests.
Skipped only where the ``docs`` extra is not installed; CI installs it."""

import glob
import inspect
import os
import re
import subprocess
import sys
from html.parser import HTMLParser

import pytest

from tests.support.helpers import REPO

SPHINX_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|data|exc|obj|const|ref):(?:`|<code>)")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The built site's folder (the build's failure output in the assertion when it fails)."""
    pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")
    pytest.importorskip("mkdocstrings", reason="the docs extra is not installed: pip install -e '.[docs]'")
    site_dir = tmp_path_factory.mktemp("docs") / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": REPO}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return site_dir


def _read(path) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


class _SectionTables(HTMLParser):
    """The first-column texts of each table mkdocstrings renders under a section title ("Parameters:")."""

    def __init__(self):
        super().__init__()
        self.tables: list[tuple[str, list[str]]] = []  # (section title, first cell of each body row)
        self._title, self._in_title, self._cell, self._column = "", False, None, 0

    def handle_starttag(self, tag, attrs):
        if tag == "span" and "doc-section-title" in (dict(attrs).get("class") or ""):
            self._in_title, self._title = True, ""
        elif tag == "table":
            self.tables.append((self._title.strip(), []))
        elif tag == "tr":
            self._column = 0
        elif tag == "td":
            self._column += 1
            self._cell = "" if self._column == 1 else None

    def handle_endtag(self, tag):
        if tag == "span":
            self._in_title = False
        elif tag == "td" and self._cell is not None:
            self.tables[-1][1].append(self._cell.strip())
            self._cell = None

    def handle_data(self, data):
        if self._in_title:
            self._title += data
        if self._cell is not None:
            self._cell += data


def _class_parameter_rows(page: str, class_id: str) -> list[str]:
    """The names in the parameters table of the class whose heading has ``id=class_id`` (its own
    docstring: from its heading to its first member's)."""
    start = page.index(f'id="{class_id}"')
    end = page.find(f'id="{class_id}.', start)
    tables = _SectionTables()
    tables.feed(page[start:end if end != -1 else None])
    rows = [names for title, names in tables.tables if title == "Parameters:"]
    assert rows, f"no parameters table in {class_id}'s docstring"
    return rows[0]


def test_mkdocs_build_strict(site):
    # The API reference was rendered from the docstrings, not left as a bare ::: line.
    page = _read(site / "reference" / "api" / "trainer" / "index.html")
    assert 'id="trainer.Trainer.fit"' in page and ":::" not in page
    assert "QuadrantClassifier" in _read(site / "tutorial" / "index.html")


def test_trainer_page_lists_every_argument_in_its_parameters_table(site):
    from trainer import Trainer

    page = _read(site / "reference" / "api" / "trainer" / "index.html")
    rows = [row.lstrip("*") for row in _class_parameter_rows(page, "trainer.Trainer")]  # **unknown_arguments
    arguments = [name for name in inspect.signature(Trainer.__init__).parameters if name != "self"]
    assert len(arguments) > 50 and len(rows) == len(set(rows)), f"an argument has several rows: {sorted(rows)}"
    missing = [name for name in arguments if name not in rows]
    assert not missing, f"Trainer arguments without a row of the parameters table: {missing}"
    assert set(rows) == set(arguments), f"rows that are no argument: {sorted(set(rows) - set(arguments))}"


def test_no_api_page_shows_a_literal_sphinx_role(site):
    pages = sorted(glob.glob(str(site / "reference" / "api" / "*" / "index.html")))
    assert len(pages) >= 5, pages
    shown = {os.path.relpath(path, site): SPHINX_ROLE.findall(_read(path)) for path in pages}
    assert not {path: roles for path, roles in shown.items() if roles}
