"""`--chroma-url`: the same stages against a real Chroma server on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

import pytest
from openai_server import FakeOpenAI
from support import free_port, read_csv, run_cli


@pytest.mark.slow
def test_generate_through_a_chroma_server(
    env: FakeOpenAI, tmp_path: Path, chroma_server: str
) -> None:
    result = run_cli("generate", "--chroma-url", chroma_server, "--out", "run")
    assert result.exit_code == 0, result.output
    rows = read_csv(tmp_path / "run" / "qa_dataset.csv")
    assert len(rows) == 30 and {row["status"] for row in rows} == {"ok"}
    assert {row["chunk_id"] for row in rows} == {f"chunk-{i:04d}" for i in range(30)}
    wrong = run_cli("generate", "--chroma-url", chroma_server, "--collection", "nope")
    assert wrong.exit_code == 2 and "'nope'" in wrong.output and "handbook" in wrong.output
    # The same server, written another way, is the same store of the run folder.
    for same in (chroma_server + "/", chroma_server.replace("127.0.0.1", "localhost")):
        again = run_cli("generate", "--chroma-url", same, "--out", "run")
        assert again.exit_code == 0 and "(30 rows done before)" in again.output, again.output
    defaults = ("--chroma-tenant", "default_tenant", "--chroma-database", "default_database")
    named = run_cli("generate", "--chroma-url", chroma_server, "--out", "run", *defaults)
    assert named.exit_code == 0, named.output


def test_an_unreachable_server_is_one_line_and_no_call(env: FakeOpenAI) -> None:
    result = run_cli("generate", "--chroma-url", f"http://127.0.0.1:{free_port()}")
    assert result.exit_code == 2
    assert result.output.startswith("Error: cannot reach the Chroma server")
    assert len(result.output.strip().splitlines()) == 1
    assert env.requests == []
