"""Serve the test suite's fake OpenAI server until killed, for the quickstart in `.ci/run`.

Prints its base URL on the first line. Standard library only: it runs on the system Python.
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from openai_server import FakeOpenAI

server = FakeOpenAI().start()
print(server.base_url, flush=True)
while True:
    time.sleep(3600)
