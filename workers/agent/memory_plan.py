"""The import planner: edited memory files, diffed against a snapshot, as knowledge-change minutes; no I/O.

`ImportPlanner` reads one file at a time against the `MemorySnapshot` it was exported from: a new file
asserts (``fact_asserted``, ``fact_learned``, with the supersessions and contradictions its slot makes), an
edited field edits (``fact_edited``), ``status: promoted`` promotes (``fact_promoted``), ``status: retracted``
or (`ImportPlanner.removed`) a deleted file retracts (``fact_retracted``). An unedited file plans nothing; a
file whose ``version`` is not the store's is refused (`MemoryConflict`). The `ImportPlan` holds the minutes;
`memory_files.plan_import` runs the planner over a whole import and writing the minutes is the caller's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from contracts.errors import ContractError
from contracts.fact_changes import (
    LEARNED_SUBJECT,
    PromotionReason,
    asserted_minute,
    contradicted_minute,
    edited_minute,
    learned_minute,
    promoted_minute,
    retracted_minute,
    superseded_minute,
)
from contracts.facts import (
    GLOBAL_KEY,
    MAX_RELATIONSHIPS,
    Fact,
    FactStatus,
    FactType,
    RelationKind,
    Relationship,
    Tier,
    TierKey,
    check_time,
    normalize_text,
    normalize_value,
)
from contracts.ids import RequestIds
from contracts.minute import Minute, iso_from_ms
from workers.agent.memory_errors import MemoryConflict, MemoryFileError, MemoryPathError
from workers.agent.memory_front_matter import FACT_KEYS, fact_front, parse
from workers.agent.memory_paths import (
    DERIVED_ROOTS,
    EDITABLE_ROOTS,
    EPISODES_ROOT,
    GLOBAL_TIER,
    check_global_grant,
    fact_path,
)
from workers.agent.memory_snapshot import MemorySnapshot
from workers.rules.fact_timeline import fit, on_promotion, place
from workers.runtime.clock import ChangeClock

SET_BY_PVM = ("id", "sources", "relations", "recorded_at", "promoted_from", "period", "version")
NEW_FACT_KEYS = tuple(key for key in FACT_KEYS if key not in SET_BY_PVM)
# Front-matter an existing fact's file may change, each with the fact field it edits (`EDITABLE_FIELDS`).
EDITED_KEYS = {
    "type": "type",
    "importance": "importance",
    "confidence": "confidence",
    "valid_from": "valid_from",
    "valid_until": "valid_until",
    "single_valued": "single_valued",
    "tags": "tags",
}
# ... and what it may not: they make the fact's identity or record its history.
FIXED_KEYS = (
    "tier",
    "task",
    "subject",
    "attribute",
    "value",
    "sources",
    "relations",
    "recorded_at",
    "promoted_from",
    "period",
)

IMPORT_AGENT = "memory-import"
RETRACTED_BY_DELETION = "its file was removed from the Markdown memory"
RETRACTED_BY_STATUS = "retracted in the Markdown memory"


@dataclass(frozen=True)
class PlannedChange:
    """One minute an import writes: which file asked for it and what it does to which fact."""

    path: str
    fact_id: str
    minute: Minute

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "event_type": self.minute.event_type,
            "fact_id": self.fact_id,
            "minute_id": self.minute.id,
            "note": self.minute.memory_note,
        }


@dataclass
class ImportPlan:
    """The minutes an import writes, in order, and how many files it found unchanged."""

    project_id: str
    changes: list[PlannedChange] = field(default_factory=list)
    unchanged: int = 0

    @property
    def minutes(self) -> list[Minute]:
        return [c.minute for c in self.changes]

    def to_dict(self) -> dict[str, Any]:
        return {
            "project_id": self.project_id,
            "minutes": len(self.changes),
            "unchanged": self.unchanged,
            "changes": [c.to_dict() for c in self.changes],
        }


@dataclass
class ImportPlanner:
    """The minutes one import plans into `plan`, file by file (`file`), then for the files that went away
    (`removed`); each change minute's id comes from `ids` and its time from `clock`."""

    snapshot: MemorySnapshot
    agent_id: str
    clock: ChangeClock
    plan: ImportPlan
    ids: RequestIds
    seen: dict[str, str] = field(default_factory=dict)  # fact id -> the file that names it
    # New facts of this import, by tier key and slot, so two new files in one slot see each other.
    fresh: list[Fact] = field(default_factory=list)
    exported_ids: dict[str, str] = field(default_factory=dict)  # path -> the fact id the export put there
    # The newest version among the files: when the folder was exported, as far as the import can tell.
    exported_at: int = 0

    def add(self, path: str, fact_id: str, minute: Minute) -> None:
        self.plan.changes.append(PlannedChange(path, fact_id, minute))

    def file(self, path: str, text: str, rendered: Mapping[str, str]) -> None:
        root = path.split("/", 1)[0]
        check_global_grant(path, self.snapshot.include_global)
        if root in DERIVED_ROOTS:
            if rendered.get(path, "").strip() != text.strip():
                kind = "an episode" if root == EPISODES_ROOT else "a thread summary"
                raise MemoryConflict(
                    f"{path}: {kind} is derived from the log by the summarize pool and is read-only here; "
                    "leave it as exported (edit the facts under facts/ or learned/ instead)"
                )
            self.plan.unchanged += 1
            return
        if rendered.get(path) == text:  # as exported: nothing to compare
            front_id = self.exported_ids.get(path)
            if front_id is not None:
                self._claim(path, front_id)
                self.exported_at = max(self.exported_at, self.snapshot.records[front_id].last_ms)
                self.plan.unchanged += 1
                return
        front, body = parse(path, text)
        fact_id = front.get("id")
        if fact_id is None:
            self._new(path, front, body)
        else:
            self._existing(path, str(fact_id), front, body)

    def _claim(self, path: str, fact_id: str) -> None:
        other = self.seen.get(fact_id)
        if other is not None:
            raise MemoryFileError(f"{path}: fact {fact_id} is also the fact of {other}; keep one file per fact")
        self.seen[fact_id] = path

    # -- an existing fact

    def _existing(self, path: str, fact_id: str, front: dict[str, Any], body: str) -> None:
        stored = self.snapshot.records.get(fact_id)
        if stored is None:
            raise MemoryFileError(
                f"{path}: id {fact_id[:40]!r} is not a fact of project {self.snapshot.project_id}; "
                "remove the id line (and version, sources, relations, recorded_at, promoted_from, period) "
                "to assert a new fact"
            )
        self._claim(path, fact_id)
        unknown = sorted(set(front) - set(FACT_KEYS))
        if unknown:
            raise MemoryFileError(
                f"{path}: {unknown[0]!r} is not a field of a fact file; fields: {', '.join(FACT_KEYS)}"
            )
        version = front.get("version")
        if isinstance(version, int) and not isinstance(version, bool):
            self.exported_at = max(self.exported_at, version)
        expected = fact_front(stored.raw, stored.last_ms)
        if _same(expected, front, stored.raw["text"], body):
            self.plan.unchanged += 1
            return
        if version != stored.last_ms:
            if isinstance(version, bool) or not isinstance(version, int):
                raise MemoryFileError(
                    f"{path}: version {version!r} must be the whole number the export wrote; export again and "
                    "redo the edit"
                )
            older = "older than" if version < stored.last_ms else "not"
            raise MemoryConflict(
                f"{path}: version {version} is {older} the store's version {stored.last_ms} of fact {fact_id}: "
                "it changed since this file was exported. Export again, redo the edit, then import"
            )
        fact = stored.fact
        for key in FIXED_KEYS:
            if key in front and not _equal(key, expected.get(key), front[key]):
                raise MemoryFileError(
                    f"{path}: {key} cannot change in place (it names the fact or records its history): to state "
                    "another value, add a new file without an id and set this one's status to retracted"
                )
        changes: dict[str, Any] = {}
        for key, name in EDITED_KEYS.items():
            if key in front and not _equal(key, expected[key], front[key]):
                changes[name] = front[key]
        if body.strip() != fact.text.strip():
            changes["text"] = body
        status = front.get("status", fact.status.value)
        if changes:
            try:
                minute = edited_minute(
                    fact, project_id=self._maker(fact), agent_id=self.agent_id, **self._stamp(), **changes
                )
            except ContractError as exc:
                raise MemoryFileError(f"{path}: {_field_problem(exc)}") from None
            self.add(path, fact.id, minute)
        if status != fact.status.value:
            self._status(path, fact, status)

    def _status(self, path: str, fact: Fact, status: Any) -> None:
        if status == FactStatus.RETRACTED.value:
            self.add(
                path,
                fact.id,
                retracted_minute(
                    fact,
                    RETRACTED_BY_STATUS,
                    project_id=self._maker(fact),
                    agent_id=self.agent_id,
                    **self._stamp(),
                ),
            )
        elif status == FactStatus.PROMOTED.value and fact.status is FactStatus.PENDING:
            promoted = fact.with_(status=FactStatus.PROMOTED)
            self.add(
                path,
                fact.id,
                promoted_minute(fact, PromotionReason.BY_HAND, agent_id=self.agent_id, **self._stamp()),
            )
            for old in on_promotion(self._slot_view(fact), promoted):
                minute = superseded_minute(old, promoted, agent_id=self.agent_id, **self._stamp())
                self.add(path, old.id, minute)
        else:
            raise MemoryFileError(
                f"{path}: status {str(status)[:40]!r}: a {fact.status.value} fact can become "
                + ("promoted or retracted" if fact.status is FactStatus.PENDING else "retracted")
                + " here (supersession follows from a new value in the slot)"
            )

    def _stamp(self) -> dict[str, str]:
        """The next change minute's id and time."""
        return {"minute_id": self.ids.next(), "timestamp": iso_from_ms(self.clock.now())}

    def _maker(self, fact: Fact) -> str | None:
        """The project whose log keeps a change to `fact`: this one for a global fact, else the fact's own."""
        return self.snapshot.project_id if fact.tier is Tier.GLOBAL else None

    def _slot_view(self, fact: Fact) -> list[Fact]:
        tier_key = str(fact.tier_key)
        held = [r.fact for r in self.snapshot.records.values() if r.raw["tier_key"] == tier_key]
        return [f for f in (*held, *self.fresh) if f.slot == fact.slot]

    # -- a new fact

    def _new(self, path: str, front: dict[str, Any], body: str) -> None:
        if path.split("/", 1)[0] not in EDITABLE_ROOTS:
            raise MemoryPathError(f"{path}: a new fact goes under facts/ (or learned/ for a learned key)")
        unknown = sorted(set(front) - set(NEW_FACT_KEYS))
        if unknown:
            set_by_pvm = set(FACT_KEYS) - set(NEW_FACT_KEYS)
            why = "is set by PVM" if unknown[0] in set_by_pvm else "is not a field of a fact file"
            raise MemoryFileError(
                f"{path}: {unknown[0]!r} {why}; a new fact (no id) may give: {', '.join(NEW_FACT_KEYS)}"
            )
        for key in ("subject", "attribute", "value"):
            if front.get(key) is None:
                raise MemoryFileError(f"{path}: {key} is required for a new fact (subject, attribute, value)")
        project_id = self.snapshot.project_id
        try:
            tier = Tier(front.get("tier", Tier.PROJECT.value))
            learned = normalize_text(str(front["subject"])) == LEARNED_SUBJECT
            if tier is Tier.GLOBAL:
                check_global_grant(path, self.snapshot.include_global, by_path=False)
                if not learned:
                    raise MemoryFileError(
                        f"{path}: tier global: a new global fact comes only by promotion (POST "
                        ".../facts/{id}/promote) or as a learned key (subject: learned); assert it in the project"
                    )
            task = front.get("task")
            if tier is Tier.GLOBAL:
                if task is not None:
                    raise MemoryFileError(f"{path}: task is for tier task only; drop it or set 'tier: task'")
                tier_key = GLOBAL_KEY
            elif tier is Tier.TASK:
                if task is None:
                    raise MemoryFileError(f"{path}: tier task names its task: add 'task: <task id>'")
                tier_key = TierKey.for_task(project_id, str(task))
            elif task is not None:
                raise MemoryFileError(f"{path}: task is for tier task only; drop it or set 'tier: task'")
            else:
                tier_key = TierKey.for_project(project_id)
        except ValueError as exc:
            if isinstance(exc, MemoryFileError):
                raise
            raise MemoryFileError(f"{path}: tier {front.get('tier')!r} must be task, project or global") from None
        value = front["value"]
        if isinstance(value, (dict, list)) or value is None:
            raise MemoryFileError(f"{path}: value must be text, a number or true/false")
        text = body.strip() or None
        tags = front.get("tags") or []
        if not isinstance(tags, list):
            raise MemoryFileError(f'{path}: tags must be a list such as ["db", "ops"], not {type(tags).__name__}')
        status = front.get("status", FactStatus.PROMOTED.value)
        when = iso_from_ms(self.clock.now())
        try:
            if learned:
                minute = learned_minute(
                    str(front["attribute"]),
                    value,
                    tier_key,
                    type=front.get("type", FactType.FACT.value),
                    text=text,
                    project_id=project_id if tier is Tier.GLOBAL else None,
                    agent_id=self.agent_id,
                    minute_id=self.ids.next(),
                    timestamp=when,
                )
                key_fact = Fact.from_dict(minute.data["fact"])
                self._claim(path, key_fact.id)
                self.fresh.append(key_fact)
                self.add(path, key_fact.id, minute)
                return
            if status not in (FactStatus.PENDING.value, FactStatus.PROMOTED.value):
                raise MemoryFileError(f"{path}: status {status!r}: a new fact is pending or promoted")
            minute_id = self.ids.next()
            fact = Fact.new(
                type=front.get("type", FactType.FACT.value),
                text=text or f"{front['subject']} {front['attribute']}: {value}",
                subject=str(front["subject"]),
                attribute=str(front["attribute"]),
                value=value,
                tier_key=tier_key,
                confidence=front.get("confidence", 1.0),
                source_minute_ids=(minute_id,),
                importance=front.get("importance"),
                status=status,
                valid_from=front.get("valid_from"),
                valid_until=front.get("valid_until"),
                recorded_at=when,
                tags=tuple(tags),
                single_valued=front.get("single_valued"),
            )
            view = self._slot_view(fact)
            placing = place(view, fact)
            if placing.restates is not None:
                held = placing.restates
                where = self.seen.get(held.id) or fact_path(held)
                raise MemoryFileError(
                    f"{path}: the slot {fact.slot} of {tier_key} holds the value {fact.value!r} already, as fact "
                    f"{held.id} ({where}); edit that file instead (or export again after an import)"
                )
            if placing.period:
                fact = fact.with_(period=placing.period)
            fitting = fit(view, fact)
            fact = fact.with_(
                relationships=tuple(
                    Relationship(RelationKind.SUPERSEDES, f.id) for f in fitting.older[-MAX_RELATIONSHIPS:]
                )
            )
            self._claim(path, fact.id)
            self.fresh.append(fact)
            self.add(path, fact.id, asserted_minute(fact, agent_id=self.agent_id, minute_id=minute_id, timestamp=when))
            for old in fitting.older:
                minute = superseded_minute(old, fact, agent_id=self.agent_id, **self._stamp())
                self.add(path, old.id, minute)
            if fitting.later is not None:
                minute = superseded_minute(fact, fitting.later, agent_id=self.agent_id, **self._stamp())
                self.add(path, fact.id, minute)
            for other in fitting.same:
                minute = contradicted_minute(fact, other, agent_id=self.agent_id, **self._stamp())
                self.add(path, fact.id, minute)
        except ContractError as exc:
            raise MemoryFileError(f"{path}: {_field_problem(exc)}") from None

    # -- files that went away

    def removed(self) -> None:
        """Retract each fact whose file is gone, if the folder was exported after its last change."""
        for fid, stored in sorted(self.snapshot.records.items()):
            if fid in self.seen or stored.raw["status"] == FactStatus.RETRACTED.value:
                continue
            if stored.raw["tier_key"] == GLOBAL_TIER:
                # Shared by every project: retracted by `status: retracted`, never by a file missing from a folder
                # that may have been exported without the grant.
                continue
            if stored.last_ms > self.exported_at:
                # Made or changed after the newest file of the folder: whoever removed its file never saw it.
                continue
            minute = retracted_minute(stored.fact, RETRACTED_BY_DELETION, agent_id=self.agent_id, **self._stamp())
            self.add(fact_path(stored.raw), fid, minute)


def _field_problem(exc: ContractError) -> str:
    field_name = getattr(exc, "field", "")
    problem = getattr(exc, "problem", str(exc))
    field_name = field_name.removeprefix("changes.")
    renamed = {"source_minute_ids": "sources", "relationships": "relations", "tier_key": "tier"}
    return f"{renamed.get(field_name, field_name)} {problem}" if field_name else str(problem)


def _equal(key: str, stored: Any, given: Any) -> bool:
    if stored == given:
        return True
    if key == "value":
        try:
            return bool(normalize_value(stored) == normalize_value(given))
        except (ContractError, TypeError):
            return False
    if key in ("valid_from", "valid_until", "recorded_at") and stored is not None and given is not None:
        try:
            return check_time(stored, key) == check_time(given, key)
        except ContractError:
            return False
    if key in ("importance", "confidence") and isinstance(given, (int, float)) and not isinstance(given, bool):
        return float(stored) == float(given)
    return False


def _same(expected: Mapping[str, Any], front: Mapping[str, Any], text: str, body: str) -> bool:
    """Whether a parsed file says what `expected` (the store's rendering) says: an unedited file, reformatted."""
    if body.strip() != text.strip() or set(front) - set(expected):
        return False
    return all(key in front and _equal(key, value, front[key]) for key, value in expected.items())
