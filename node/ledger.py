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

from sqlalchemy import Boolean, Integer, LargeBinary, String, and_, create_engine, event, or_, select
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


def _drawn() -> tuple[object, ...]:
    return SubmissionRow.member_weight.is_not(None), SubmissionRow.member_weight != "0"


def _sampled_accept_in_appeal() -> object:
    return and_(SubmissionRow.accept.is_(True), SubmissionRow.audited.is_not(None), SubmissionRow.round > 0)


def _write_ahead(connection: object, _record: object) -> None:
    """Each connection writes through SQLite's write-ahead log, synced at every commit (`synchronous=FULL`): a
    commit is as durable as with the rollback journal, at a fraction of its cost (no journal file made, synced and
    deleted per transaction), and a pass's reads never wait for another process's write."""
    cursor = connection.cursor()  # type: ignore[attr-defined]
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.close()


class SubmissionLedger:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.engine = create_engine(f"sqlite:///{path}")
        event.listen(self.engine, "connect", _write_ahead)
        Base.metadata.create_all(self.engine)
        with self.engine.begin() as connection:
            columns = {row[1] for row in connection.exec_driver_sql("PRAGMA table_info(submissions)")}
            for name, kind in MIGRATIONS.items():
                if name not in columns:
                    connection.exec_driver_sql(f"ALTER TABLE submissions ADD COLUMN {name} {kind}")
            # Rows a validator of the arbiter design had challenged (stage 1) are open work again.
            connection.exec_driver_sql("UPDATE submissions SET stage = 0 WHERE stage = 1")
            # Each pass asks for a job's open rows: an index keeps that proportional to the open rows, not to
            # every lease the job ever had.
            connection.exec_driver_sql("CREATE INDEX IF NOT EXISTS ix_submissions_open ON submissions (job, stage)")

    def cursor(self, job: str) -> int:
        with Session(self.engine) as session:
            row = session.get(Cursor, job.lower())
            return row.last_block if row else -1

    def record_events(self, job: str, submissions: list[tuple[int, bytes, str, int]], up_to_block: int,
                      appeals: list[tuple[int, int]] = ()) -> int:
        """Insert new submissions (lease, root, worker, version), move leases to appeal rounds (lease, round),
        and move the cursor, atomically; returns how many submissions were new."""
        job = job.lower()
        inserted = 0
        with Session(self.engine) as session, session.begin():
            for lease_id, root, worker, version in submissions:
                if session.get(SubmissionRow, (job, lease_id)) is None:
                    inserted += 1
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
        return inserted

    def _rows(self, job: str, *conditions: object) -> list[Pending]:
        """The job's rows meeting `conditions`, in lease order (plain column reads: no ORM objects)."""
        table = SubmissionRow.__table__.c
        query = (select(table.job, table.lease_id, table.root, table.worker, table.policy_version, table.accept,
                        table.reason, table.round, table.member_weight, table.voted_round, table.audited)
                 .where(table.job == job.lower(), *conditions).order_by(table.lease_id))
        with self.engine.connect() as connection:
            return [Pending(r[0], r[1], r[2], r[3], r[4], None if r[5] is None else bool(r[5]), r[6], r[7],
                            None if r[8] is None else int(r[8]), r[9], r[10])
                    for r in connection.execute(query)]

    def unjudged(self, job: str) -> list[Pending]:
        return self._rows(job, SubmissionRow.accept.is_(None))

    def unattested(self, job: str) -> list[Pending]:
        return self._rows(job, SubmissionRow.accept.is_not(None), SubmissionRow.attested.is_(False))

    def all(self, job: str) -> list[Pending]:
        return self._rows(job)

    def open_rows(self, job: str) -> list[Pending]:
        """Rows whose lease may still need this node (not final, or chores left)."""
        return self._rows(job, SubmissionRow.stage == OPEN)

    def undrawn(self, job: str) -> list[Pending]:
        """Open rows whose current round's committee this node has not placed itself on (or off) yet."""
        return self._rows(job, SubmissionRow.stage == OPEN, SubmissionRow.member_weight.is_(None))

    def to_judge(self, job: str) -> list[Pending]:
        """Open rows of rounds that drew this node and want a verdict: none yet, or a sampled accept in an
        appeal round (which verifies every rollout)."""
        return self._rows(job, SubmissionRow.stage == OPEN, *_drawn(), or_(
            SubmissionRow.accept.is_(None), _sampled_accept_in_appeal()))

    def to_vote(self, job: str) -> list[Pending]:
        """Open rows with a verdict, of rounds that drew this node and that it has not voted in (a sampled accept
        in an appeal round is never voted: it is judged again first)."""
        return self._rows(job, SubmissionRow.stage == OPEN, *_drawn(), SubmissionRow.accept.is_not(None),
                          SubmissionRow.voted_round < SubmissionRow.round, ~_sampled_accept_in_appeal())

    def contestable(self, job: str) -> list[Pending]:
        """Open rows with a verdict of this node that is not a sampled accept (what an appeal may stand on)."""
        return self._rows(job, SubmissionRow.stage == OPEN, SubmissionRow.accept.is_not(None),
                          or_(SubmissionRow.accept.is_(False), SubmissionRow.audited.is_(None)))

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
