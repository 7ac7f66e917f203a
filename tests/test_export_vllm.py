"""vLLM reads what the export writes (``unifiedplayers.export``): a tiny run's players, exported at its end, loaded
from their directories by vLLM as ``vllm serve`` loads them, decode greedily the tokens that transformers'
``from_pretrained`` of the same directories decodes (float32), and a bfloat16 export is served in bfloat16. vLLM's
``dtype=auto`` serves a float32 checkpoint in half precision (bfloat16 on CPU), so float32 is asked for. Runs in .venv-vllm
(``make test-vllm``) and is skipped where vllm is not importable; the comparison is tests/export_greedy.py's."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from unifiedplayers.config import compose  # noqa: E402
from unifiedplayers.export import EXPORT_META, main  # noqa: E402
from unifiedplayers.rundir import EXPORT  # noqa: E402
from unifiedplayers.loop.outer import OuterLoop  # noqa: E402

from tests import export_greedy  # noqa: E402

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A finished tiny run (one update of each player) whose players are exported at its end, in float32."""
    d = tmp_path_factory.mktemp("export") / "run"
    OuterLoop(compose(["experiment=tiny", "schedule.export_at_end=true"]), d).run()
    return d


def test_vllm_decodes_the_export_as_transformers_does(run_dir, capsys):
    export = run_dir / EXPORT / "execution"
    assert json.loads((export / EXPORT_META).read_text())["dtype"] == "float32"
    result = export_greedy.compare(export, tokens=24, dtype="float32")
    with capsys.disabled():  # the figures, in `make test-vllm`'s output
        print()
        export_greedy.report(export, result, 24)
    assert result["hf_dtype"] == result["vllm_dtype"] == "float32"
    for row in result["rows"]:
        assert row["vllm"] == row["hf"], row
        assert row["logprob_diff"] < 1e-4, row


def test_vllm_serves_a_bfloat16_export_in_bfloat16(run_dir, tmp_path):
    """A bfloat16 export's config.json makes vLLM serve it in bfloat16 by default; tokens are not compared (the
    bfloat16 kernels of the two differ)."""
    out = tmp_path / "planning"
    main([str(run_dir), "--role", "planning", "--out", str(out), "--dtype", "bfloat16"])
    llm = export_greedy.vllm_engine(out, "auto")
    assert str(llm.llm_engine.model_config.dtype) == "torch.bfloat16"
    tokens, _ = export_greedy.vllm_greedy(llm, [[1, 2, 3]], 4)[0]
    assert len(tokens) == 4
