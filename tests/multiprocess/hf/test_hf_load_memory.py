"""Peak resident memory while a saved Hugging Face directory loads (bench/hf_load_memory.py measures it):
under FSDP 2 each rank's peak RSS over the load, from the start of ``configure_model`` to the first step
(the model built on the meta device, materialised shard by shard, each rank reading its own slices),
stays below the size of one whole copy of the model; one process loading the same directory rises by
at least that much (so the measure sees a whole copy when there is one). The model is a Llama of 12
layers x 512 (about 150 MB in fp32), shaped as language models are (its layers most of the weights).
The export (``trainer consolidate --format hf``) is measured beside it and must only succeed."""

from __future__ import annotations

import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))),
                     "bench")
pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the peak RSS from /proc/self/status")
def test_no_fsdp_rank_holds_a_whole_copy_while_loading():
    sys.path.insert(0, BENCH)
    try:
        from hf_load_memory import run
    finally:
        sys.path.remove(BENCH)
    results = run(layers=12, width=512, vocab=1024)
    whole = results["model_bytes"]
    print(f"\nmodel {whole / 2**20:.0f} MB; load {results['load']}; export {results['export']}")
    (single,) = results["load"]["single"]
    assert single["peak_reset"] and single["peak_increase"] >= whole, single
    for rank in results["load"]["fsdp2"]:
        assert rank["peak_reset"], rank  # the peak is the load's own, not the process's since it started
        assert rank["param_bytes"] < 0.51 * whole, rank
        assert rank["peak_increase"] < whole, (rank, whole)
    assert results["export"]["peak_rss"] > 0
