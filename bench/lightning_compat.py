"""Lightning's own tests against the mirror: ``python bench/lightning_compat.py PATH_TO_LIGHTNING_CHECKOUT``.

Runs chosen files of the checkout's ``tests/tests_pytorch`` (one pytest process per file, CPU) twice,
each from a copy in a temporary folder: as Lightning wrote them, under the installed Lightning; then
with their import paths rewritten to ``trainer.lightning`` (bench/_lightning_compat_rewrite.py),
under the mirror. Only tests that pass under Lightning count. A failure under the mirror is
classified (bench/_lightning_compat_classify.py): internal (not counted), documented difference,
refusal, missing name, wrong result. Writes ``bench/compat/lightning_compat.json`` and the generated
part of ``docs/lightning-compat.md``. Not part of the suite: Lightning's tests are not in this
repository (a clone made at development time; ``git archive`` of Lightning's repository will do).

``--files`` picks other files (paths under tests_pytorch); ``--reuse-lightning`` keeps the Lightning
side of the last results file (the checkout and Lightning must be the same).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _lightning_compat_classify import SourceIndex, classify_failure  # noqa: E402
from _lightning_compat_report import write_page  # noqa: E402
from _lightning_compat_rewrite import prepare  # noqa: E402
from _results import machine  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULT = os.path.join(REPO, "bench", "compat", "lightning_compat.json")  # (bench/results/: benchmarks only)
PAGE = os.path.join(REPO, "docs", "lightning-compat.md")
FILES = [
    "trainer/flags/test_barebones.py", "trainer/flags/test_check_val_every_n_epoch.py",
    "trainer/flags/test_env_vars.py", "trainer/flags/test_fast_dev_run.py", "trainer/flags/test_inference_mode.py",
    "trainer/flags/test_limit_batches.py", "trainer/flags/test_min_max_epochs.py",
    "trainer/flags/test_overfit_batches.py", "trainer/flags/test_val_check_interval.py",
    "trainer/logging_/test_train_loop_logging.py", "trainer/logging_/test_eval_loop_logging.py",
    "trainer/optimization/test_manual_optimization.py", "trainer/optimization/test_multiple_optimizers.py",
    "trainer/test_dataloaders.py", "models/test_hooks.py", "core/test_datamodules.py",
    "core/test_lightning_module.py", "callbacks/test_early_stopping.py",
    "checkpointing/test_model_checkpoint.py", "loggers/test_csv.py", "loggers/test_tensorboard.py",
    "trainer/properties/test_estimated_stepping_batches.py", "trainer/properties/test_get_model.py",
    "trainer/properties/test_log_dir.py", "trainer/properties/test_loggers.py",
]


def run_file(root: str, file: str, timeout: int, per_test: int) -> dict[str, dict]:
    """``{test id: {"outcome", "text", "seconds"}}`` of one pytest process over ``tests_pytorch/file``."""
    report = os.path.join(root, "junit.xml")
    if os.path.exists(report):
        os.remove(report)
    command = ["timeout", str(timeout), sys.executable, "-m", "pytest", f"tests_pytorch/{file}", "-q",
               "-p", "no:cacheprovider", "--tb=short", f"--timeout={per_test}", f"--junitxml={report}",
               "-o", "junit_logging=no", "--no-header", "-rN"]
    environment = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONDONTWRITEBYTECODE="1")
    completed = subprocess.run(command, cwd=root, env=environment, capture_output=True, text=True)
    if not os.path.exists(report):
        tail = (completed.stdout + completed.stderr)[-2000:]
        return {f"{file}::<file>": {"outcome": "error", "text": f"pytest exited {completed.returncode}\n{tail}",
                                    "seconds": 0.0}}
    return parse_junit(report, file)


def parse_junit(report: str, file: str) -> dict[str, dict]:
    """Test ids (``file::[Class::]name``) and outcomes of a junit report."""
    module = "tests_pytorch." + file[:-3].replace("/", ".")
    results = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        rest = classname[len(module):].lstrip(".") if classname.startswith(module) else ""
        test = f"{file}::{rest + '::' if rest else ''}{name}" if classname else f"{file}::<file>"
        outcome, text = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                text = (child.get("message") or "") + "\n" + (child.text or "")
                break
        if test in results and results[test]["outcome"] == "passed" and outcome == "error":
            outcome = "error"  # a teardown error after a pass fails the test
        results[test] = {"outcome": outcome, "text": text[-6000:], "seconds": float(case.get("time") or 0)}
    return results


def compare(checkout: str, files: list[str], lightning: dict, mirror: dict) -> list[dict]:
    """One row per test that passed under Lightning: internal?, the mirror's outcome and its class."""
    rows = []
    for file in files:
        index = SourceIndex(os.path.join(checkout, "tests", "tests_pytorch", file))
        mirror_file = {k: v for k, v in mirror.items() if k.startswith(file + "::")}
        file_error = mirror_file.get(f"{file}::<file>")
        for test, result in sorted(lightning.items()):
            if not test.startswith(file + "::") or result["outcome"] != "passed":
                continue
            name = test[len(file) + 2:]
            ours = mirror_file.get(test) or file_error or {"outcome": "not run", "text": "not run (a timeout?)"}
            row = {"test": test, "file": file, "outcome": ours["outcome"], "internal": index.internal_reason(name)}
            if ours["outcome"] != "passed":
                kind, cause = classify_failure(ours["text"], REPO, ours.get("root", ""))
                if kind == "internal" and not row["internal"]:
                    row["internal"] = cause
                row.update({"class": kind, "cause": cause})
            rows.append(row)
    return rows


def summarize(rows: list[dict]) -> dict:
    """Counts: over all files and per file."""

    def count(selection: list[dict]) -> dict:
        counted = [r for r in selection if not r["internal"]]
        passed = sum(r["outcome"] == "passed" for r in counted)
        classes = Counter(r["class"] for r in counted if r["outcome"] != "passed")
        return {"lightning_passed": len(selection), "internal": len(selection) - len(counted),
                "counted": len(counted), "passed": passed, "failed_by_class": dict(classes),
                "pass_rate": round(passed / len(counted), 4) if counted else None}

    files = sorted({r["file"] for r in rows})
    causes = Counter((r["class"], r["cause"]) for r in rows if not r["internal"] and r["outcome"] != "passed")
    return {"total": count(rows), "files": {f: count([r for r in rows if r["file"] == f]) for f in files},
            "top_causes": [{"class": k, "cause": c, "tests": n, "example": next(
                r["test"] for r in rows if not r["internal"] and r.get("cause") == c and r.get("class") == k)}
                for (k, c), n in causes.most_common(40)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", help="a clone of Lightning's repository (its tests/tests_pytorch and src/)")
    parser.add_argument("--files", nargs="*", default=FILES, help="paths under tests/tests_pytorch (none: only --merge)")
    parser.add_argument("--file-timeout", type=int, default=1800, help="seconds for one file's pytest process")
    parser.add_argument("--test-timeout", type=int, default=120, help="seconds for one test")
    parser.add_argument("--reuse-lightning", action="store_true",
                        help="the Lightning side of the last results (of the first --merge file when given)")
    parser.add_argument("--merge", nargs="*", default=[],
                        help="results (or .partial) files whose outcomes stand for the files not run now (later wins)")
    parser.add_argument("--out", default=RESULT)
    parser.add_argument("--page", default=PAGE, help="the docs page whose generated part is rewritten ('' = none)")
    args = parser.parse_args()
    checkout = os.path.abspath(args.checkout)
    started = time.time()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ltcompat-") as work:
        lightning_root = prepare(checkout, os.path.join(work, "lightning"), rewrite=False)
        mirror_root = prepare(checkout, os.path.join(work, "mirror"), rewrite=True)
        lightning, mirror = {}, {}
        reuse = args.merge[0] if args.merge else args.out
        if args.reuse_lightning and os.path.exists(reuse):
            with open(reuse) as f:
                kept = json.load(f)["lightning"]
            broken = {k.split("::")[0] for k in kept if k.endswith("::<file>")}  # run again: it did not collect
            lightning = {k: v for k, v in kept.items() if k.split("::")[0] in set(args.files) - broken}
        for file in args.files:
            if not any(k.startswith(file + "::") for k in lightning):
                lightning.update(run_file(lightning_root, file, args.file_timeout, args.test_timeout))
            mirror.update({k: dict(v, root=mirror_root) for k, v in
                           run_file(mirror_root, file, args.file_timeout, args.test_timeout).items()})
            with open(args.out + ".partial", "w") as f:  # what is done so far, for a look while it runs
                json.dump({"lightning": lightning, "mirror": mirror}, f)
            done = sum(v["outcome"] == "passed" for k, v in mirror.items() if k.startswith(file + "::"))
            print(f"{file}: Lightning {sum(v['outcome'] == 'passed' for k, v in lightning.items() if k.startswith(file + '::'))}"
                  f" passed, mirror {done} passed ({time.time() - started:.0f}s)", flush=True)
        files = list(args.files)
        for merged in args.merge:  # a later file's outcomes of a file replace an earlier one's
            with open(merged) as f:
                previous = json.load(f)
            for side, outcomes in (("lightning", lightning), ("mirror", mirror)):
                ran = previous.get("settings", {}).get("ran")  # the files that run itself ran (not merged)
                given = {t.split("::")[0] for t in previous[side]
                         if ran is None or t.split("::")[0] in ran} - set(args.files)
                for test in [t for t in outcomes if t.split("::")[0] in given]:
                    del outcomes[test]
                outcomes.update({t: v for t, v in previous[side].items() if t.split("::")[0] in given})
        if args.merge:
            files = FILES + sorted({t.split("::")[0] for t in mirror} - set(FILES))
            files = [f for f in files if any(t.startswith(f + "::") for t in mirror)]
        rows = compare(checkout, files, lightning, mirror)
    summary = summarize(rows)
    result = {"benchmark": "lightning_compat", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "command": " ".join(["python", "bench/lightning_compat.py"] + sys.argv[1:]),
              "machine": machine(), "settings": {"checkout": checkout, "files": files, "ran": args.files,
                                                 "not_measured": [f for f in FILES if f not in files],
                                                 "checkout_commit": _commit(checkout)},
              "summary": summary, "rows": rows,
              # the raw outcomes, for --merge and --reuse-lightning (a failure's text: its end)
              "lightning": {k: {"outcome": v["outcome"], "text": v["text"][-600:] if v["outcome"] != "passed" else "",
                                "seconds": v["seconds"]} for k, v in lightning.items()},
              "mirror": {k: {"outcome": v["outcome"], "text": v["text"][-2000:] if v["outcome"] != "passed" else "",
                             "seconds": v["seconds"], "root": v.get("root", "")} for k, v in mirror.items()}}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    if os.path.exists(args.out + ".partial"):
        os.remove(args.out + ".partial")
    if args.page:
        write_page(args.page, result)
    total = summary["total"]
    print(f"{total['passed']} of {total['counted']} counted tests pass ({total['pass_rate']}); "
          f"{total['internal']} internal; results: {args.out}")


def _commit(checkout: str) -> str | None:
    """The checkout's commit, when it is a git work tree (a ``git archive`` copy says so in COMMIT)."""
    marker = os.path.join(checkout, "COMMIT")
    if os.path.exists(marker):
        with open(marker) as f:
            return f.read().strip()
    try:
        return subprocess.run(["git", "-C", checkout, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


if __name__ == "__main__":
    main()
