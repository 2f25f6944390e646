"""A node's ledger of a job's submissions (SQLAlchemy, SQLite by default): how far it has followed each job,
and every submission it has seen and what it decided. The validator records verdicts and votes in it;
the trainer records which batches it admitted, so a restart never admits a batch twice.

Invariants: a submission row is created once per (job, lease) and the event cursor advances in the same
transaction, so a crash between the two never loses or repeats an event; a verdict is written before any
vote is sent, so after a restart the same verdict is attested (never a second, different one); a row is
marked attested only once the chain shows this validator's vote; a row's stage only moves forward (open,
challenged by us, closed), so the per-round work covers undecided rows and our own challenges only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Boolean, Integer, LargeBinary, String, create_engine, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column


class Base(DeclarativeBase):
    pass


class Cursor(Base):
    __tablename__ = "cursors"
    job: Mapped[str] = mapped_column(String(42), primary_key=True)
    last_block: Mapped[int] = mapped_column(Integer)


class SubmissionRow(Base):
    __tablename__ = "submissions"
    job: Mapped[str] = mapped_column(String(42), primary_key=True)
    lease_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    root: Mapped[bytes] = mapped_column(LargeBinary(32))
    worker: Mapped[str] = mapped_column(String(42))
    policy_version: Mapped[int] = mapped_column(Integer)
    accept: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    reason: Mapped[str | None] = mapped_column(String, nullable=True)
    attested: Mapped[bool] = mapped_column(Boolean, default=False)
    stage: Mapped[int] = mapped_column(Integer, default=0)  # OPEN, CHALLENGED (by us) or CLOSED


OPEN, CHALLENGED, CLOSED = 0, 1, 2


@dataclass(frozen=True)
class Pending:
    job: str
    lease_id: int
    root: bytes
    worker: str
    policy_version: int
    accept: bool | None
    reason: str | None


class SubmissionLedger:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.engine = create_engine(f"sqlite:///{path}")
        Base.metadata.create_all(self.engine)
        with self.engine.begin() as connection:  # ledgers written before the `stage` column existed
            columns = {row[1] for row in connection.exec_driver_sql("PRAGMA table_info(submissions)")}
            if "stage" not in columns:
                connection.exec_driver_sql("ALTER TABLE submissions ADD COLUMN stage INTEGER DEFAULT 0")

    def cursor(self, job: str) -> int:
        with Session(self.engine) as session:
            row = session.get(Cursor, job.lower())
            return row.last_block if row else -1

    def record_events(self, job: str, submissions: list[tuple[int, bytes, str, int]], up_to_block: int) -> None:
        """Insert new submissions (lease, root, worker, version) and move the cursor, atomically."""
        job = job.lower()
        with Session(self.engine) as session, session.begin():
            for lease_id, root, worker, version in submissions:
                if session.get(SubmissionRow, (job, lease_id)) is None:
                    session.add(SubmissionRow(job=job, lease_id=lease_id, root=root, worker=worker,
                                              policy_version=version, accept=None, reason=None, attested=False,
                                              stage=OPEN))
            cursor = session.get(Cursor, job)
            if cursor is None:
                session.add(Cursor(job=job, last_block=up_to_block))
            else:
                cursor.last_block = max(cursor.last_block, up_to_block)

    def _rows(self, job: str, *conditions: object) -> list[Pending]:
        with Session(self.engine) as session:
            rows = session.scalars(select(SubmissionRow).where(SubmissionRow.job == job.lower(), *conditions)
                                   .order_by(SubmissionRow.lease_id))
            return [Pending(r.job, r.lease_id, r.root, r.worker, r.policy_version, r.accept, r.reason) for r in rows]

    def unjudged(self, job: str) -> list[Pending]:
        return self._rows(job, SubmissionRow.accept.is_(None))

    def unattested(self, job: str) -> list[Pending]:
        return self._rows(job, SubmissionRow.accept.is_not(None), SubmissionRow.attested.is_(False))

    def all(self, job: str) -> list[Pending]:
        return self._rows(job)

    def in_stage(self, job: str, stage: int) -> list[Pending]:
        """Judged rows at `stage` (OPEN: the decision may still need a challenge; CHALLENGED: ours, awaiting
        resolution; CLOSED: nothing left to do)."""
        return self._rows(job, SubmissionRow.accept.is_not(None), SubmissionRow.stage == stage)

    def set_stage(self, job: str, lease_id: int, stage: int) -> None:
        with Session(self.engine) as session, session.begin():
            row = session.get(SubmissionRow, (job.lower(), lease_id))
            if row is not None:
                row.stage = stage

    def record_verdict(self, job: str, lease_id: int, accept: bool, reason: str) -> None:
        with Session(self.engine) as session, session.begin():
            row = session.get(SubmissionRow, (job.lower(), lease_id))
            if row is not None and row.accept is None:  # a verdict, once written, never changes
                row.accept, row.reason = accept, reason

    def mark_attested(self, job: str, lease_ids: list[int]) -> None:
        with Session(self.engine) as session, session.begin():
            for lease_id in lease_ids:
                row = session.get(SubmissionRow, (job.lower(), lease_id))
                if row is not None:
                    row.attested = True
