"""Find a plan's documents by the user's own handle: the id of their record, or an input and a
record number there.

Each store answers from its provenance files (``Source.find_id``: a binary search of the id keys
kept per shard; ``Source.find_record``: a binary search of the records, which ascend by input
and record), so a lookup costs a few reads per shard, whatever the store's size. A plan's
sources are searched in order (or the one named); a source that records no provenance is
passed over, and said so when no source could be searched.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokentape._src.audit.runs import source_index
from tokentape._src.plan.plan import Plan, open_planned
from tokentape._src.store.origins import Origin, match_input, no_such_input
from tokentape._src.store.reader import TokenStream
from tokentape._src.train.batch import DocOrigin
from tokentape._src.util.checks import as_index, shown
from tokentape._src.util.text import fmt_int
from tokentape.errors import ArgumentError, InputError, StoreError

MATCHES_SHOWN = 10
"""The matches an error lists when a handle names several documents."""


@dataclass(frozen=True)
class Handle:
    """How the user names a document: ``id``, or ``input`` and ``record``."""

    id: str | None = None
    input: str | None = None
    record: int | None = None

    def __post_init__(self) -> None:
        if self.id is not None:
            if not isinstance(self.id, str):
                raise ArgumentError(f"id must be a string, got {shown(self.id)}")
            if self.input is not None or self.record is not None:
                raise ArgumentError("give an id, or an input and a record, not both")
        elif self.input is None or self.record is None:
            raise ArgumentError("give an id, or an input and a record (both)")
        else:
            if not isinstance(self.input, str) or not self.input:
                raise ArgumentError(f"input must be a path, got {shown(self.input)}")
            as_index("record", self.record)

    def __str__(self) -> str:
        if self.id is not None:
            return f"id {shown(self.id)}"
        return f"record {self.record} of input {shown(self.input)}"


def find_documents(plan: Plan, handle: Handle, source: str | None = None) -> list[DocOrigin]:
    """Every document of the plan's sources (or of ``source``) that ``handle`` names, in the
    plan's source order and by document.

    Raises:
        StoreError: No source searched records provenance.
        InputError: An input path that no searched source read, or that matches several of
            one source's inputs.
    """
    indexes = range(len(plan.sources)) if source is None else [source_index(plan, source)]
    found: list[DocOrigin] = []
    searched, missing = 0, []
    for d in indexes:
        store = open_planned(plan, d)
        if not store.has_provenance:
            continue
        searched += 1
        if handle.input is not None:
            paths = [row["path"] for row in store.inputs() or []]
            if match_input(paths, handle.input, str(store.directory)) is None:
                missing.append(str(no_such_input(paths, handle.input, str(store.directory))))
                continue
        name = plan.sources[d].name
        found += [DocOrigin(name, doc, _origin(store, doc)) for doc in _docs(store, handle)]
    if not searched:
        which = (
            f"source {shown(source)} records no provenance"
            if source is not None
            else "no source of the plan records provenance"
        )
        by = "id" if handle.id is not None else "input and record"
        raise StoreError(
            f"{which} (a store made before tokentape recorded it, or a Megatron prefix): "
            f"cannot find a document by {by}"
        )
    if handle.input is not None and len(missing) == searched:
        raise InputError(missing[0] if searched == 1 else f"no source of the plan read input "
                         f"{shown(handle.input)} ({missing[0]})")  # fmt: skip
    return found


def _docs(store: TokenStream, handle: Handle) -> list[int]:
    if handle.id is not None:
        return store.find_id(handle.id)
    assert handle.input is not None and handle.record is not None
    return store.find_record(handle.input, handle.record)


def _origin(store: TokenStream, doc: int) -> Origin:
    origin = store.provenance(doc)
    assert origin is not None  # the store records provenance: it was searched
    return origin


def origin_of(found: DocOrigin) -> Origin:
    """The origin of a document ``find_documents`` found (always recorded: it was searched)."""
    assert found.origin is not None
    return found.origin


def one_document(plan: Plan, handle: Handle, source: str | None = None) -> DocOrigin:
    """The one document ``handle`` names; an ``InputError`` naming what was searched when
    none is found, or listing the matches when several are."""
    found = find_documents(plan, handle, source)
    where = f"source {shown(source)}" if source is not None else "the plan's sources"
    if not found:
        raise InputError(f"no document of {where} has {handle}")
    if len(found) > 1:
        listed = "; ".join(
            f"{f.source} doc {f.doc} ({origin_of(f).where})" for f in found[:MATCHES_SHOWN]
        )
        more = len(found) - MATCHES_SHOWN
        tail = f"; and {fmt_int(more)} more" if more > 0 else ""
        raise InputError(
            f"{handle} names {fmt_int(len(found))} documents of {where}: {listed}{tail}; "
            "give SOURCE DOC for one of them"
        )
    return found[0]


__all__ = ["MATCHES_SHOWN", "DocOrigin", "Handle", "find_documents", "one_document"]
