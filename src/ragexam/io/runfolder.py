"""The run folder: every file a run writes, its control runs, and the exam it holds.

A run folder holds one exam, from one store and collection: its identity, recorded in
`manifest.json` by the first stage that reads the store. A stage pointed at another store or
collection is refused before any call, and the folder is left as it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ragexam.config import AnswerContext
from ragexam.errors import ConfigError
from ragexam.io.atomic import folder_error
from ragexam.io.manifest import read_manifest, set_run_field

QA_FILE = "qa_dataset.csv"
ANSWERS_FILE = "answers.csv"
JUDGMENTS_FILE = "judgments.csv"
CONTROLS_FILE = "judge_controls.csv"
DROPPED_FILE = "dropped_questions.csv"
KEY_POINTS_FILE = "key_points.csv"  # key points written once for an exam without them
BATCHES_DIR = "batches"  # the batch road's ledgers, request shards, results and carry
# `run --control-runs` answers and grades in these folders, each answerer given this context
CONTROL_RUNS = {"gold": AnswerContext.gold, "closed_book": AnswerContext.none}


@dataclass(frozen=True)
class Identity:
    """The store and collection an exam comes from, as the manifest records them."""

    store: str
    collection: str

    def describe(self) -> str:
        """E.g. `collection 'handbook' of /data/chroma`."""
        return f"collection {self.collection!r} of {self.store}"


@dataclass(frozen=True)
class RunFolder:
    """One run folder (`--out`) and the files in it."""

    path: Path

    @property
    def qa_dataset(self) -> Path:
        """The exam generate writes."""
        return self.path / QA_FILE

    @property
    def answers(self) -> Path:
        """What answer writes."""
        return self.path / ANSWERS_FILE

    @property
    def judgments(self) -> Path:
        """What judge writes."""
        return self.path / JUDGMENTS_FILE

    @property
    def dropped(self) -> Path:
        """The harder questions generate wrote and its verification dropped, with why."""
        return self.path / DROPPED_FILE

    @property
    def controls(self) -> Path:
        """The judge's known-answer controls."""
        return self.path / CONTROLS_FILE

    @property
    def key_points(self) -> Path:
        """Key points judge wrote for an exam without them: a control run uses its run's."""
        return (self.parent_run() or self).path / KEY_POINTS_FILE

    def batch_tag(self, stage: str) -> str:
        """The stage's name on the batch road: `judge`, or `gold.judge` in a control run.

        It prefixes every custom_id and shard name, so that the stages and control runs of one
        run can share a --batch-dir.
        """
        parent = self.parent_run()
        return f"{self.path.name}.{stage}" if parent is not None else stage

    def batch_ledger(self, stage: str) -> Path:
        """The stage's batch ledger: every shard, batch and result file, as they happen."""
        return self.path / BATCHES_DIR / f"{self.batch_tag(stage)}.jsonl"

    def batch_files(self, stage: str) -> Path:
        """Where the stage's shards, downloaded results and carried results are kept."""
        return self.path / BATCHES_DIR / self.batch_tag(stage)

    def batch_ledgers(self) -> list[Path]:
        """Every stage's batch ledger in this run and its control runs (whichever it is): the
        stages a command may send at once."""
        top = self.parent_run() or self
        runs = [top, *(top.control_run(name) for name in CONTROL_RUNS)]
        return [path for run in runs for path in sorted((run.path / BATCHES_DIR).glob("*.jsonl"))]

    def file(self, name: str) -> Path:
        """Any other file of the folder, by name (report.html, calibration.csv...)."""
        return self.path / name

    def control_run(self, name: str) -> RunFolder:
        """The folder of one control run (`gold`, `closed_book`)."""
        if name not in CONTROL_RUNS:
            raise ValueError(f"no control run {name!r}")
        return RunFolder(self.path / name)

    def control_runs(self) -> dict[str, RunFolder]:
        """The control runs this folder holds graded answers of."""
        runs = {name: self.control_run(name) for name in CONTROL_RUNS}
        return {name: run for name, run in runs.items() if run.judgments.exists()}

    def parent_run(self) -> RunFolder | None:
        """The run folder this one is a control run of, if it is one."""
        if self.path.name in CONTROL_RUNS and (self.path.parent / "manifest.json").exists():
            return RunFolder(self.path.parent)
        return None

    def exam(self) -> Path:
        """The exam: here, else the one a stage of this run recorded reading."""
        return self.input_file(QA_FILE, "qa_dataset")

    def answers_read(self) -> Path:
        """The answers: here, else the ones a stage of this run recorded reading."""
        return self.input_file(ANSWERS_FILE, "answers")

    def input_file(self, name: str, key: str) -> Path:
        """`name` here, else the file a stage of this run recorded reading as `key`."""
        local = self.path / name
        if local.exists():
            return local
        stages = read_manifest(self.path).get("stages")
        for record in stages.values() if isinstance(stages, dict) else ():
            recorded = record.get(key) if isinstance(record, dict) else None
            if isinstance(recorded, str) and Path(recorded).is_file():
                return Path(recorded)
        return local

    def identity(self) -> Identity | None:
        """The store and collection of the folder's exam, if a stage recorded them."""
        manifest = read_manifest(self.path)
        exam = manifest.get("exam")
        if isinstance(exam, dict) and exam.get("store") and exam.get("collection"):
            return Identity(str(exam["store"]), str(exam["collection"]))
        stages = manifest.get("stages")
        generate = stages.get("generate") if isinstance(stages, dict) else None
        if isinstance(generate, dict) and generate.get("store") and generate.get("collection"):
            return Identity(_legacy_store(str(generate["store"])), str(generate["collection"]))
        return None  # a folder made before identities were recorded, or not yet used

    def check(self, identity: Identity) -> None:
        """Refuse a stage pointed at another store or collection than the folder's exam."""
        held = self.identity()
        if held is not None and held != identity:
            raise ConfigError(
                f"{self.path} holds the exam of {held.describe()}, but this command points at "
                f"{identity.describe()}: give it another --out (with --qa-dataset to sit this "
                "exam on that store)"
            )

    def claim(self, identity: Identity) -> None:
        """Check the identity, then record it if the folder had none (a stage calls this when
        every other input is checked, just before its rows: a refused stage records nothing)."""
        self.check(identity)
        if "exam" not in read_manifest(self.path):
            self.make()
            exam = {"store": identity.store, "collection": identity.collection}
            set_run_field(self.path, "exam", exam)

    def make(self) -> None:
        """Create the folder (and its parents) if need be, or say why it cannot be one."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise folder_error(self.path, exc) from None


def _legacy_store(store: str) -> str:
    """A store as versions before identities recorded it: the --chroma path as typed (the
    quickstart's `examples/chroma`), made absolute from where ragexam runs now; a URL as it is."""
    if "://" in store:
        return store
    return str(Path(store).resolve())


def file_identity(path: Path) -> tuple[int, int]:
    """What says a file is the same one: its size and modification time."""
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


def answered_as_it_is(exam: Path, answers: Path) -> bool:
    """Whether the exam is the very file `answer` read when it last wrote these answers (it
    drops the answers of edited questions as it starts): then no answer can be to another
    version of its question, and a million answers need no check."""
    stages = read_manifest(answers.parent).get("stages")
    record = stages.get("answer") if isinstance(stages, dict) else None
    if not isinstance(record, dict) or record.get("qa_dataset") != str(exam.resolve()):
        return False
    try:
        return tuple(record.get("qa_dataset_read") or ()) == file_identity(exam)
    except OSError:
        return False
