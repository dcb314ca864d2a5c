"""The harness that compares Lightning programs under Lightning and under this trainer
(tests/support/lightning_oracle.py): the import rewriting changes import lines only, the hook tracer
records every call (the same hook twice is two records) without changing what the traced object
looks like to code that inspects it, and it survives pickling (spawned ranks)."""

from __future__ import annotations

import ast
import inspect
import os
import pickle
import re
import subprocess
import sys

import pytest
import torch
from torch import nn

from tests.support.lightning_trace import MODULE_HOOKS, TraceSink, format_calls, instrument, read_rank_trace
from tests.support.lightning_oracle import PROGRAMS, assert_same_numbers, ProgramRun
from tests.support.lightning_rewrite import rewrite_imports

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PROGRAM_DIR = os.path.join(REPO, "tests", "support", "lightning_programs")


def _lightning_import_lines(tree: ast.Module) -> set[int]:
    """The line numbers of import statements that name Lightning."""
    lines = set()
    for node in ast.walk(tree):
        names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                 else [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
        if any(name.split(".")[0] in ("lightning", "pytorch_lightning") for name in names):
            lines.update(range(node.lineno, node.end_lineno + 1))
    return lines


@pytest.mark.parametrize("name", PROGRAMS + ("trace_callback",))
def test_the_rewrite_changes_the_lightning_import_lines_and_nothing_else(name):
    with open(os.path.join(PROGRAM_DIR, name + ".py")) as f:
        source = f.read()
    rewritten = rewrite_imports(source)
    before, after = source.splitlines(), rewritten.splitlines()
    assert len(before) == len(after)
    import_lines = _lightning_import_lines(ast.parse(source))
    assert import_lines, "every program imports Lightning"
    changed = {number for number, (a, b) in enumerate(zip(before, after), start=1) if a != b}
    assert changed == import_lines
    for number in changed:
        a, b = before[number - 1], after[number - 1]
        # the module name changed, the rest of the line as it was
        assert re.sub(r"trainer\.lightning", "X", b) == re.sub(r"lightning\.pytorch|lightning", "X", a, count=1), (a, b)
    assert not _lightning_import_lines(ast.parse(rewritten))  # no import of Lightning is left


def test_the_rewrite_keeps_names_strings_and_comments():
    source = (
        "import lightning as L\n"
        "import lightning\n"
        "from pytorch_lightning.callbacks import (\n    ModelCheckpoint,\n)  # lightning\n"
        "text = 'import lightning as L'\n"
        "def main():\n    from lightning.pytorch import Trainer; import torch\n    return lightning.Trainer\n"
    )
    assert rewrite_imports(source) == (
        "import trainer.lightning as L\n"
        "import trainer.lightning as lightning\n"
        "from trainer.lightning.callbacks import (\n    ModelCheckpoint,\n)  # lightning\n"
        "text = 'import lightning as L'\n"
        "def main():\n    from trainer.lightning import Trainer; import torch\n    return lightning.Trainer\n"
    )
    assert rewrite_imports("import torch\nx = 1\n") == "import torch\nx = 1\n"


def test_an_import_that_needs_more_than_its_own_line_changed_is_refused():
    with pytest.raises(ValueError, match=r"import lightning.pytorch as NAME"):
        rewrite_imports("import lightning.pytorch\ntrainer = lightning.pytorch.Trainer()\n")


class _Hooks(nn.Module):
    """Overrides one hook (``on_train_start``), calls another of its own hooks from a hook."""

    def on_train_start(self):
        self.on_train_epoch_start()
        self.on_train_epoch_start()
        return "started"

    def on_train_epoch_start(self):
        pass

    def setup(self, stage):
        pass

    def training_step(self, batch, batch_idx, dataloader_idx=0):
        return batch * 2


class _Base(nn.Module):
    def on_fit_start(self):
        pass


class _Derived(_Base):
    def on_fit_start(self):
        return 1


def test_the_tracer_records_each_call_with_its_scalar_arguments_in_order():
    sink = TraceSink()
    module = instrument(_Hooks(), sink, "module", MODULE_HOOKS)
    assert module.on_train_start() == "started"
    module.setup(stage="fit")
    assert torch.equal(module.training_step(torch.ones(2), 3), torch.full((2,), 2.0))
    assert sink.calls == [
        ("module", "on_train_start", {}),
        ("module", "on_train_epoch_start", {}),  # a hook the program calls twice: two records
        ("module", "on_train_epoch_start", {}),
        ("module", "setup", {"stage": "fit"}),
        ("module", "training_step", {"batch_idx": 3}),  # the tensor is not recorded; no default filled in
    ]
    assert format_calls(sink.calls).splitlines()[-1] == "module.training_step(batch_idx=3)"


def test_a_traced_hook_looks_like_the_method_to_code_that_inspects_it():
    from lightning_utilities.core.overrides import is_overridden

    sink = TraceSink()
    derived = instrument(_Derived(), sink, "module", ("on_fit_start",))
    base = instrument(_Base(), sink, "module", ("on_fit_start",))
    assert is_overridden("on_fit_start", derived, _Base)
    assert not is_overridden("on_fit_start", base, _Base)
    module = instrument(_Hooks(), sink, "module", MODULE_HOOKS)
    assert list(inspect.signature(module.training_step).parameters) == ["batch", "batch_idx", "dataloader_idx"]
    assert module.training_step.__func__ is _Hooks.training_step


def test_a_traced_module_pickles_and_keeps_tracing_into_its_sink(tmp_path):
    sink = TraceSink(str(tmp_path))
    module = instrument(_Hooks(), sink, "module", MODULE_HOOKS)
    module.setup("fit")
    copy = pickle.loads(pickle.dumps(module))  # as a spawned rank receives it
    copy.setup("validate")
    assert copy.setup.sink is not sink
    assert [call[2] for call in copy.setup.sink.calls] == [{"stage": "fit"}, {"stage": "validate"}]
    # what a rank wrote is read back (rank 0: no process group here)
    assert read_rank_trace(str(tmp_path)).calls == copy.setup.sink.calls


def test_the_number_comparison_can_fail():
    run = ProgramRun(calls=[], values=[], results={}, numbers={"loss": torch.tensor(1.0), "name": "'a'"})
    assert_same_numbers(run, ProgramRun([], [], {}, {"loss": torch.tensor(1.0 + 1e-7), "name": "'a'"}), rtol=1e-5)
    for other in ({"loss": torch.tensor(1.001), "name": "'a'"}, {"loss": torch.tensor(1.0), "name": "'b'"},
                  {"loss": torch.tensor(1.0)}):
        with pytest.raises(AssertionError):
            assert_same_numbers(run, ProgramRun([], [], {}, other), rtol=1e-5)


def test_a_fresh_process_finds_the_rewritten_programs():
    # A spawned rank unpickles a program's class by its module name: importing the alias package
    # installs the finder there too.
    code = ("import importlib.util\n"
            "spec = importlib.util.find_spec('tests.support.lightning_as_ours.manual_gan')\n"
            "print(type(spec.loader).__name__, spec.origin.endswith('lightning_programs/manual_gan.py'))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": REPO}, timeout=120)
    assert done.stdout.split() == ["RewritingFinder", "True"], done.stderr


def test_the_callback_hook_table_is_lightnings():
    import lightning.pytorch

    from tests.support.lightning_trace import CALLBACK_HOOKS, callback_signature

    defined = {name for name, value in vars(lightning.pytorch.Callback).items()
               if callable(value) and not name.startswith("_")}
    assert set(CALLBACK_HOOKS) == defined
    for name in CALLBACK_HOOKS:
        ours = callback_signature(name).parameters.values()
        theirs = inspect.signature(getattr(lightning.pytorch.Callback, name)).parameters.values()
        assert [(p.name, p.kind, p.default) for p in ours] == [(p.name, p.kind, p.default) for p in theirs], name


def test_a_default_hook_is_marked_and_left_out_of_the_comparison():
    import lightning.pytorch

    from tests.support.lightning_oracle import compared_calls

    class Program(lightning.pytorch.LightningModule):
        def on_fit_start(self):
            pass

    sink = TraceSink()
    module = instrument(Program(), sink, "module", MODULE_HOOKS)
    module.on_fit_start()
    module.on_train_start()  # Lightning's own no-op
    assert sink.calls == [("module", "on_fit_start", {}), ("module*", "on_train_start", {})]
    assert compared_calls(ProgramRun(sink.calls, [], {})) == [("module", "on_fit_start", {})]
    # a trainer that calls only the hooks a program overrides sees the same through the wrapper
    for name, overridden in (("on_fit_start", True), ("on_train_start", False)):
        method = getattr(module, name)
        assert (getattr(method, "__func__", method) is not getattr(lightning.pytorch.LightningModule, name)) == overridden
