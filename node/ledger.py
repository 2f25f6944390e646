"""A node's ledger of a job's submissions (SQLAlchemy, SQLite by default): how far it has followed each job,
every submission it has seen, which round each lease is in and whether this node sits on that round's
committee, what it decided, and which rounds it voted in. The validator records verdicts and votes in it;
the trainer records which batches it admitted, so a restart never admits a batch twice.

Invariants: a submission row is created once per (job, lease) and the event cursor advances in the same
transaction as the rows and round changes it covers, so a crash between the two never loses or repeats an
event; a row's round only moves forward, and moving it forgets the membership of the old round; a verdict
is written before any vote is sent and never changes, so after a restart the same verdict is voted (never
a second, different one), with one exception: an accept from a sampled audit (`audited` holds how many
rollouts were verified) may be replaced once by the verdict of an audit of the whole batch (an appeal
round verifies everything), and never the other way; `voted_round` only grows; a row's stage only moves
forward (open, closed), so the per-round work covers leases that are not final only.
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
    stage: Mapped[int] = mapped_column(Integer, default=0)  # OPEN or CLOSED
    round: Mapped[int] = mapped_column(Integer, default=0)
    member_weight: Mapped[str | None] = mapped_column(String, nullable=True)  # wei as text; None: not known yet
    voted_round: Mapped[int] = mapped_column(Integer, default=-1)
    audited: Mapped[int | None] = mapped_column(Integer, nullable=True)  # rollouts verified; None: all of them


OPEN, CLOSED = 0, 2
MIGRATIONS = {  # columns added after the first ledgers were written
    "stage": "INTEGER DEFAULT 0", "round": "INTEGER DEFAULT 0", "member_weight": "VARCHAR",
    "voted_round": "INTEGER DEFAULT -1", "audited": "INTEGER",
}


@dataclass(frozen=True)
class Pending:
    job: str
    lease_id: int
    root: bytes
    worker: str
    policy_version: int
    accept: bool | None
    reason: str | None
    round: int = 0
    member_weight: int | None = None
    voted_round: int = -1
    audited: int | None = None  # rollouts the verdict verified (None: every one)

    @property
    def member(self) -> bool:
        return bool(self.member_weight)

    @property
    def sampled_accept(self) -> bool:
        """Whether the verdict is an accept that verified only a sample: it proves no batch good."""
        return bool(self.accept) and self.audited is not None


class SubmissionLedger:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.engine = create_engine(f"sqlite:///{path}")
        Base.metadata.create_all(self.engine)
        with self.engine.begin() as connection:
            columns = {row[1] for row in connection.exec_driver_sql("PRAGMA table_info(submissions)")}
            for name, kind in MIGRATIONS.items():
                if name not in columns:
                    connection.exec_driver_sql(f"ALTER TABLE submissions ADD COLUMN {name} {kind}")
            # Rows a validator of the arbiter design had challenged (stage 1) are open work again.
            connection.exec_driver_sql("UPDATE submissions SET stage = 0 WHERE stage = 1")

    def cursor(self, job: str) -> int:
        with Session(self.engine) as session:
            row = session.get(Cursor, job.lower())
            return row.last_block if row else -1

    def record_events(self, job: str, submissions: list[tuple[int, bytes, str, int]], up_to_block: int,
                      appeals: list[tuple[int, int]] = ()) -> None:
        """Insert new submissions (lease, root, worker, version), move leases to appeal rounds (lease, round),
        and move the cursor, atomically."""
        job = job.lower()
        with Session(self.engine) as session, session.begin():
            for lease_id, root, worker, version in submissions:
                if session.get(SubmissionRow, (job, lease_id)) is None:
                    session.add(SubmissionRow(job=job, lease_id=lease_id, root=root, worker=worker,
                                              policy_version=version, accept=None, reason=None, attested=False,
                                              stage=OPEN, round=0, member_weight=None, voted_round=-1))
            session.flush()
            for lease_id, round_ in appeals:
                row = session.get(SubmissionRow, (job, lease_id))
                if row is not None and round_ > row.round:
                    row.round, row.member_weight = round_, None
            cursor = session.get(Cursor, job)
            if cursor is None:
                session.add(Cursor(job=job, last_block=up_to_block))
            else:
                cursor.last_block = max(cursor.last_block, up_to_block)

    def _rows(self, job: str, *conditions: object) -> list[Pending]:
        with Session(self.engine) as session:
            rows = session.scalars(select(SubmissionRow).where(SubmissionRow.job == job.lower(), *conditions)
                                   .order_by(SubmissionRow.lease_id))
            return [Pending(r.job, r.lease_id, r.root, r.worker, r.policy_version, r.accept, r.reason, r.round,
                            None if r.member_weight is None else int(r.member_weight), r.voted_round, r.audited)
                    for r in rows]

    def unjudged(self, job: str) -> list[Pending]:
        return self._rows(job, SubmissionRow.accept.is_(None))

    def unattested(self, job: str) -> list[Pending]:
        return self._rows(job, SubmissionRow.accept.is_not(None), SubmissionRow.attested.is_(False))

    def all(self, job: str) -> list[Pending]:
        return self._rows(job)

    def open_rows(self, job: str) -> list[Pending]:
        """Rows whose lease may still need this node (not final, or chores left)."""
        return self._rows(job, SubmissionRow.stage == OPEN)

    def _update(self, job: str, lease_id: int, **values: object) -> None:
        with Session(self.engine) as session, session.begin():
            row = session.get(SubmissionRow, (job.lower(), lease_id))
            if row is not None:
                for name, value in values.items():
                    setattr(row, name, value)

    def set_membership(self, job: str, lease_id: int, round_: int, weight: int) -> None:
        """This node's vote weight in `round_` of the lease (0: not drawn), if the row is still in that round."""
        with Session(self.engine) as session, session.begin():
            row = session.get(SubmissionRow, (job.lower(), lease_id))
            if row is not None and row.round == round_:
                row.member_weight = str(weight)

    def mark_voted(self, job: str, lease_id: int, round_: int) -> None:
        with Session(self.engine) as session, session.begin():
            row = session.get(SubmissionRow, (job.lower(), lease_id))
            if row is not None and round_ > row.voted_round:
                row.voted_round = round_

    def close(self, job: str, lease_id: int) -> None:
        self._update(job, lease_id, stage=CLOSED)

    def record_verdict(self, job: str, lease_id: int, accept: bool, reason: str, audited: int | None = None) -> None:
        """Write a verdict that verified `audited` rollouts (None: all); see the invariant for when one changes."""
        with Session(self.engine) as session, session.begin():
            row = session.get(SubmissionRow, (job.lower(), lease_id))
            if row is None:
                return
            sampled_accept = bool(row.accept) and row.audited is not None
            if row.accept is None or (sampled_accept and audited is None):
                row.accept, row.reason, row.audited = accept, reason, audited

    def mark_attested(self, job: str, lease_ids: list[int]) -> None:
        with Session(self.engine) as session, session.begin():
            for lease_id in lease_ids:
                row = session.get(SubmissionRow, (job.lower(), lease_id))
                if row is not None:
                    row.attested = True
