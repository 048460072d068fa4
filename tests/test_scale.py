"""What keeps ragexam fast at scale: resume cost, connections per call in flight, import cost."""

from __future__ import annotations

import asyncio
import gc
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage
from openai_server import FakeOpenAI, Faults
from support import exam, read_csv, run_cli

from ragexam.config import load_settings
from ragexam.errors import InputFileError, LLMError
from ragexam.io.csvfile import _checked_file, _valid_columns, read_columns, read_rows
from ragexam.io.rowlog import RowLog
from ragexam.llm.client import LLM
from ragexam.stages.judge import JUDGE_COLUMNS
from ragexam.stages.runner import Runner, Stage


def test_resuming_a_file_of_ok_rows_appends_to_it_in_place(env: FakeOpenAI, tmp_path: Path) -> None:
    exam(tmp_path / "run", 30)
    output = tmp_path / "run" / "judgments.csv"
    assert run_cli("judge", "--controls", "0", "--out", "run", "--limit", "10").exit_code == 0
    first, written = output.stat().st_ino, output.read_bytes()
    assert run_cli("judge", "--controls", "0", "--out", "run").exit_code == 0
    # the same file, its first ten rows byte for byte, and twenty rows appended after them
    assert output.stat().st_ino == first and output.read_bytes().startswith(written)
    assert len(read_csv(output)) == 30 and env.count() == 30


def test_an_error_row_to_drop_rewrites_the_file(env: FakeOpenAI, tmp_path: Path) -> None:
    exam(tmp_path / "run", 20)
    output = tmp_path / "run" / "judgments.csv"
    env.faults = Faults(status_if=lambda text: 400 if "Question #4?" in text else None)
    assert (
        run_cli("judge", "--controls", "0", "--out", "run").exit_code == 0
    )  # 1 error in 20 is the 5% allowed
    assert [row["qa_id"] for row in read_csv(output) if row["status"] == "error"] == ["q4"]
    first = output.stat().st_ino
    env.faults = Faults()
    assert run_cli("judge", "--controls", "0", "--out", "run").exit_code == 0
    rows = read_csv(output)
    assert output.stat().st_ino != first  # rewritten, without the error row
    assert len(rows) == 20 and {row["status"] for row in rows} == {"ok"}
    assert env.count() == 21


def test_a_rewrite_keeps_every_cell_of_the_ok_rows(env: FakeOpenAI, tmp_path: Path) -> None:
    exam(tmp_path / "run", 12)
    output = tmp_path / "run" / "judgments.csv"
    env.faults = Faults(status_if=lambda text: 400 if "Question #7?" in text else None)
    assert (
        run_cli("judge", "--controls", "0", "--out", "run", "--max-error-rate", "0.5").exit_code
        == 0
    )
    before = output.read_bytes().splitlines(keepends=True)
    env.faults = Faults()
    assert run_cli("judge", "--controls", "0", "--out", "run").exit_code == 0
    after = output.read_bytes().splitlines(keepends=True)
    # resume read only the key, status and fingerprint of each ok row: the rewrite copies them
    # whole from the file, then the redone row q7 is appended
    assert after[:-1] == [line for line in before if not line.startswith(b"q7,")]
    assert after[-1].startswith(b"q7,") and read_csv(output)[-1]["status"] == "ok"


def test_resume_holds_far_less_than_the_rows_it_reads(tmp_path: Path) -> None:
    stage = Stage("judge", tmp_path / "judgments.csv", "qa_id", JUDGE_COLUMNS, "m", "p")
    row = {"status": "ok", "model": "m", "prompt_hash": "p", "reasoning": "Why. " * 60}
    rows = [{**row, "qa_id": f"q{i}", "input_hash": f"{i:016x}"} for i in range(20_000)]
    rows[5]["status"] = "error"  # one row to drop: the file is rewritten
    RowLog(stage.path, stage.all_columns()).rewrite(rows)
    size = stage.path.stat().st_size
    tracemalloc.start()
    try:
        done = Runner(stage, concurrency=1).resume()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(done) == 19_999 and len(read_csv(stage.path)) == 19_999
    # five columns of each ok row: 1.6x the file's size; all of every row, and the file, was 5.1x
    assert peak < 2.5 * size


# -- the transport --------------------------------------------------------------------------------


def test_one_connection_per_call_in_flight(env: FakeOpenAI, tmp_path: Path) -> None:
    # The SDK's default pool keeps 100 idle connections and reopens the rest on every wave.
    env.latency = 0.3
    exam(tmp_path / "run", 3 * 128)
    result = run_cli("judge", "--controls", "0", "--out", "run", "--concurrency", "128")
    assert result.exit_code == 0, result.output
    assert env.count() == 3 * 128
    assert 64 <= env.connections <= 1.1 * 128


@contextmanager
def hanging_up(tls: ssl.SSLContext | None = None) -> Iterator[str]:
    """A server that reads each request and closes the connection without a reply."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.05)
        while not stop.is_set():
            with suppress(TimeoutError, OSError):
                connection, _ = listener.accept()
                with tls.wrap_socket(connection, server_side=True) if tls else connection as link:
                    link.recv(65536)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def test_a_dropped_connection_is_retried_and_named_not_called_a_timeout(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exam(tmp_path / "run", 3)
    monkeypatch.setenv("RAGEXAM_MAX_RETRIES", "1")
    with hanging_up() as url:
        monkeypatch.setenv("OPENAI_BASE_URL", url)
        result = run_cli("judge", "--controls", "0", "--out", "run", "--max-error-rate", "1")
    # no call reached the endpoint: exit 4, whatever --max-error-rate allows, rows kept
    assert result.exit_code == 4 and "Server disconnected" in result.output, result.output
    rows = read_csv(tmp_path / "run" / "judgments.csv")
    assert len(rows) == 3 and {row["status"] for row in rows} == {"error"}
    for row in rows:
        assert "Server disconnected" in row["error"] and "timed out" not in row["error"]
        assert row["attempts"] == "2"  # one retry, in ragexam's layer only


def test_a_refused_connection_is_named_not_called_a_timeout(
    env: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]  # free once closed: nothing listens there
    monkeypatch.setenv("OPENAI_BASE_URL", f"http://127.0.0.1:{port}/v1")
    monkeypatch.setenv("RAGEXAM_MAX_RETRIES", "0")
    llm = LLM(load_settings(), "gpt-test")

    async def ask() -> None:
        try:
            await llm.text([HumanMessage("hello")])
        finally:
            await llm.aclose()

    with pytest.raises(LLMError, match="cannot connect to the endpoint") as caught:
        asyncio.run(ask())
    assert "timed out" not in str(caught.value)


def test_the_proxy_the_environment_names_is_used(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exam(tmp_path / "run", 2)
    monkeypatch.setenv("RAGEXAM_MAX_RETRIES", "0")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://ragexam-test.invalid/v1")  # no such host
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    with hanging_up() as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.removesuffix("/v1"))
        result = run_cli("judge", "--out", "run", "--max-error-rate", "1")
    assert result.exit_code == 4, result.output  # no call got through
    rows = read_csv(tmp_path / "run" / "judgments.csv")
    # the proxy took the calls (and hung up on them): the unknown host was never looked up
    assert all("Server disconnected" in row["error"] for row in rows), rows


# -- time to the first call -----------------------------------------------------------------------


@pytest.mark.slow
def test_a_command_loads_only_the_libraries_it_uses() -> None:
    code = (
        "import sys\n"
        "from ragexam.cli.app import app\n"
        "try:\n"
        "    app(['--help'], standalone_mode=False)\n"
        "finally:\n"
        "    heavy = ('openai', 'langchain_core', 'chromadb', 'pandas', 'numpy', 'aiohttp')\n"
        "    print([name for name in heavy if name in sys.modules])\n"
        "    import ragexam.stages.judge\n"
        "    print([name for name in ('chromadb', 'pandas', 'numpy') if name in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    help_loads, judge_loads = done.stdout.strip().splitlines()[-2:]
    assert help_loads == "[]"  # --help and the CLI itself: no LLM, store or numeric library
    assert judge_loads == "[]"  # judge: no store and no numeric library


def test_a_command_leaves_the_cycle_collector_as_it_found_it(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    # judge loads its libraries and reads its inputs with the collector held, then freezes
    # what it loaded; a caller in the same process gets the collector back, failed or not
    exam(tmp_path / "run", 2)
    assert run_cli("judge", "--out", "run", "--controls", "0").exit_code == 0
    assert gc.isenabled() and gc.get_freeze_count() == 0
    result = run_cli("judge", "--out", "elsewhere")
    assert result.exit_code == 2, result.output
    assert gc.isenabled() and gc.get_freeze_count() == 0


@pytest.mark.slow
def test_an_https_endpoint_is_checked_against_trusted_roots(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a self-signed certificate")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    request = ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=x"]
    subprocess.run(
        ["openssl", *request, "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    with hanging_up(tls) as url:
        monkeypatch.setenv("OPENAI_BASE_URL", url.replace("http://", "https://"))
        monkeypatch.setenv("RAGEXAM_MAX_RETRIES", "0")
        exam(tmp_path / "run", 1)
        result = run_cli("judge", "--controls", "0", "--out", "run", "--max-error-rate", "1")
    assert result.exit_code == 4 and "certificate verify failed" in result.output, result.output
    (row,) = read_csv(tmp_path / "run" / "judgments.csv")
    # a self-signed certificate is refused: the key is never sent to an unverified server
    assert "certificate verify failed" in row["error"], row["error"]


def test_a_valid_file_reads_the_same_in_one_pass_as_record_by_record(tmp_path: Path) -> None:
    lines = [
        "qa_id,question,answer,status",
        'a,\'=1+1,"two\nlines",ok',  # an escaped formula, a quoted newline
        "",  # a blank line is no record
        "b,plain,'-3,error\r",  # a CRLF ending, an escaped minus
        'c,"q, quoted",,ok',
        "d,,no question,error",  # an empty question, allowed in an error row
        'e,"\'@x","it\'s",ok',  # an escaped cell in quotes; an apostrophe inside a cell
    ]
    data = ("\n".join(lines) + "\n").encode()
    path = tmp_path / "x.csv"
    path.write_bytes(data)
    args = (("qa_id",), "qa_id", ("question",))
    assert _valid_columns(data, *args) is not None  # read in one pass
    fast = read_rows(path, *args)
    assert fast == _checked_file(path, data, *args)
    assert [row["question"] for row in fast] == ["=1+1", "plain", "q, quoted", "", "@x"]
    assert fast[0]["answer"] == "two\nlines" and fast[1]["answer"] == "-3"
    assert fast[4]["answer"] == "it's"
    columns = read_columns(path, *args)
    assert {name: list(cells) for name, cells in columns.items()} == {
        "qa_id": ["a", "b", "c", "d", "e"],
        "question": ["=1+1", "plain", "q, quoted", "", "@x"],
        "answer": ["two\nlines", "-3", "", "no question", "it's"],
        "status": ["ok", "error", "ok", "error", "ok"],
    }
    # any doubt goes to the careful reading, which names the line
    assert _valid_columns(data.replace(b"b,plain", b"a,plain"), ("qa_id",), "qa_id", ()) is None
    assert _valid_columns(data + b"f,x\n", ("qa_id",), None, ()) is None  # too few fields
    assert _valid_columns(data + b"f,\xff,x,ok\n", ("qa_id",), None, ()) is None  # not UTF-8
    assert _valid_columns(data + b"f, ,x,ok\n", ("qa_id",), None, ("question",)) is None  # empty
    # Asked for some columns, the one pass keeps only those (and status), with the same cells;
    # a doubt still goes to the careful reading, which keeps the same columns or names the line.
    kept = read_columns(path, *args, optional=("absent",))
    assert {name: list(cells) for name, cells in kept.items()} == {
        name: list(cells) for name, cells in columns.items() if name != "answer"
    }
    (tmp_path / "z.csv").write_bytes(data + b"f,x\n")
    with pytest.raises(InputFileError, match="line 9"):
        read_columns(tmp_path / "z.csv", *args, optional=())


@pytest.mark.parametrize(
    "data",
    [
        b"name,value\nx,'=1\n",  # after a comma
        b"name,value\n'=1,x\n",  # after a newline
        b"name,value\r'=1,x\r",  # after a carriage return, the file's line ending
        b'name,value\n"\'=1",x\n',  # after the quote that opens it
    ],
)
def test_an_escaped_cell_is_unescaped_wherever_it_starts(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "x.csv"
    path.write_bytes(data)
    (row,) = read_rows(path, ("name",))
    assert sorted(row.values()) == ["=1", "x"]


def test_an_apostrophe_inside_a_cell_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_bytes(b"name,value\nit's,'quoted'\n")  # no cell escaped: none starts with '=
    assert read_rows(path, ("name",)) == [{"name": "it's", "value": "'quoted'"}]


def test_a_file_the_one_pass_doubts_reads_the_same_as_columns(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("qa_id,question,status,\na,Q?,ok,\nb,R?,error,\n", encoding="utf-8")
    data = path.read_bytes()
    assert _valid_columns(data, ("qa_id",), "qa_id", ()) is None  # a column without a name
    assert read_rows(path, ("qa_id",), "qa_id") == [
        {"qa_id": "a", "question": "Q?", "status": "ok"},
        {"qa_id": "b", "question": "R?", "status": "error"},
    ]
    columns = read_columns(path, ("qa_id",), "qa_id")
    assert columns == {"qa_id": ["a", "b"], "question": ["Q?", "R?"], "status": ["ok", "error"]}


def test_an_empty_filled_cell_in_an_ok_row_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("qa_id,question,status\na,Q?,ok\nb,,error\nc,  ,\n", encoding="utf-8")
    for read in (read_rows, read_columns):
        with pytest.raises(InputFileError, match="line 4: the question is empty"):
            read(path, ("qa_id",), "qa_id", ("question",))
