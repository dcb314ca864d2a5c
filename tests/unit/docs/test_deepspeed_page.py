"""docs/how-to/deepspeed.md shows the example configs of docs/examples/deepspeed as they are in the repository
(the page's commands run them under the docs test; tests/unit/tools/test_deepspeed_config.py runs every
example through train.py)."""

import json
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PAGE = os.path.join(ROOT, "docs", "how-to", "deepspeed.md")
EXAMPLES = os.path.join(ROOT, "docs", "examples", "deepspeed")


def titled_json_blocks() -> dict[str, str]:
    with open(PAGE) as handle:
        page = handle.read()
    return {m.group(1): m.group(2) for m in re.finditer(r'^```json title="([^"]+)"\n(.*?)^```$', page, re.M | re.S)}


def test_the_page_shows_every_example_config_as_it_is_in_the_repository():
    shown = titled_json_blocks()
    assert sorted(shown) == sorted(os.listdir(EXAMPLES))
    for name, body in shown.items():
        with open(os.path.join(EXAMPLES, name)) as handle:
            assert body == handle.read(), f"{name}: the page and docs/examples/deepspeed/{name} differ"
        json.loads(body)


def test_the_page_names_each_example_in_its_table():
    with open(PAGE) as handle:
        page = handle.read()
    for name in os.listdir(EXAMPLES):
        assert f"| `{name}` |" in page, name
