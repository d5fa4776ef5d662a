"""Plain-text views of a manifest and a plan, for the command-line program and the demo."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from tokentape._src.audit.prefix_info import PrefixInfo
from tokentape._src.plan.plan import Plan
from tokentape._src.store.format import Manifest, numpy_dtype
from tokentape._src.store.origins import Origin
from tokentape._src.tape.blend import stated_value
from tokentape._src.tape.resolve import Tape
from tokentape._src.util.text import escaped, fmt_bytes, fmt_int, key_values, table


def dropped_text(docs: dict[str, int], tokens: dict[str, int]) -> str:
    if not docs:
        return "none"
    return "; ".join(
        f"{name}: {fmt_int(n)} docs, {fmt_int(tokens.get(name, 0))} tokens"
        for name, n in docs.items()
    )


def manifest_text(directory: str, m: Manifest, inputs: list[dict[str, Any]] | None = None) -> str:
    """``tokentape info``: a manifest in human form, and the inputs table (``inputs``: the
    store's ``inputs.json``; None: it records no provenance)."""
    tok = m.tokenizer
    stats = m.filters
    size = m.n_tokens * numpy_dtype(m.dtype).itemsize
    filters = ", ".join(
        f["name"] + "".join(f" {k}={v}" for k, v in f.items() if k != "name")
        for f in stats.get("config", [])
    )
    head = key_values(
        [
            ("store", directory),
            ("format", f"{m.format} v{m.format_version}, created by {m.created_by}"),
            ("tokens", f"{fmt_int(m.n_tokens)} ({m.dtype}, {fmt_bytes(size)})"),
            ("documents", fmt_int(m.n_docs)),
            ("tokenizer", f"{tok.get('kind')} {tok.get('spec', '')}".rstrip()),
            ("vocabulary", f"{fmt_int(m.vocab_size)} ids, end-of-document id {m.eod_id}"),
            ("start of document", _bos_text(m)),
            ("fingerprint", tok.get("fingerprint", "?")),
            ("content hash", m.content_hash),
            ("filters", filters or "none"),
            ("documents read", fmt_int(stats.get("docs_in", m.n_docs))),
            (
                "dropped",
                dropped_text(stats.get("dropped_docs", {}), stats.get("dropped_tokens", {})),
            ),
            ("input files", fmt_int(len(m.inputs.get("files", [])))),
            *bad_records_rows(m.extra.get("bad_records")),
        ]
    )
    shards = table(
        ["shard", "tokens", "docs", "bin sha256"],
        [[s.name, s.n_tokens, s.n_docs, s.bin_sha256[:16]] for s in m.shards],
    )
    return f"{head}\n\n{shards}\n\n{inputs_text(inputs)}"


def prefix_text(p: PrefixInfo) -> str:
    """``tokentape info PREFIX``: a Megatron prefix in human form."""
    ident = p.identity
    if ident is None:
        identity = [
            ("identity", f"not recorded yet: `tokentape verify {p.prefix} --vocab-size V "
             "--eod-id E` hashes it once and records it"),
        ]  # fmt: skip
    else:
        ids = "no tokens" if ident.min_id is None else f"{ident.min_id}..{ident.max_id}"
        ends = "not one id" if ident.end_id is None else f"id {ident.end_id}"
        identity = [("content hash", ident.content_hash), ("token ids", ids),
                    ("documents end with", ends)]  # fmt: skip
    return key_values(
        [
            ("megatron prefix", p.prefix),
            ("tokens", f"{fmt_int(p.n_tokens)} ({p.dtype}, .bin {fmt_bytes(p.bin_bytes)})"),
            ("documents", fmt_int(p.n_docs)),
            ("sequences", f"{fmt_int(p.n_sequences)} (.idx {fmt_bytes(p.idx_bytes)})"),
            *identity,
        ]
    )


def _bos_text(m: Manifest) -> str:
    if m.bos_id is None:
        return "no beginning-of-document token"
    token = repr(m.tokenizer.get("bos_token"))
    return f"beginning-of-document id {m.bos_id} ({token[:40]})"


def bad_records_rows(bad: object, shown: int = 3) -> list[tuple[str, str]]:
    """Rows for the records a job skipped as bad (``--on-bad-record skip``): how many of how
    many, per reason, and the first ``shown`` locations; none when it skipped none (or kept no
    such record). What a manifest holds there is shown only as far as it is well formed."""
    if not isinstance(bad, dict) or not bad:  # {}: not a skipping job
        return []
    skipped, records = bad.get("skipped"), bad.get("records")
    if type(skipped) is not int or type(records) is not int:
        return [("bad records", "recorded, not readable")]
    share = f" ({skipped / records:.2%})" if records > 0 else ""
    reasons = bad.get("reasons")
    listed = ", ".join(
        f"{k} {fmt_int(v)}" for k, v in (reasons.items() if isinstance(reasons, dict) else [])
        if isinstance(k, str) and type(v) is int
    )  # fmt: skip
    first = bad.get("first")
    where = [w for w in first if isinstance(w, str)] if isinstance(first, list) else []
    head = f"{fmt_int(skipped)} skipped of {fmt_int(records)}{share}"
    return [("bad records", head + (f": {listed}" if listed else ""))] + [
        ("", escaped(w)) for w in where[:shown]
    ]


def inputs_text(inputs: list[dict[str, Any]] | None) -> str:
    """The inputs a store was made from and what each gave, or why there is no such table."""
    if inputs is None:
        return (
            "provenance: not recorded (a store made before tokentape recorded where each "
            "document came from, or converted from Megatron)"
        )
    rows = [
        [
            escaped(str(row.get("path"))),
            escaped(str(row.get("kind"))),
            escaped(str(row.get("id_key") or "-")),
            fmt_int(int(row.get("docs_in", 0))),
            fmt_int(int(row.get("docs_kept", 0))),
            fmt_int(int(row.get("docs_dropped", 0))),
        ]
        for row in inputs
    ]
    return table(["input", "kind", "id field", "read", "kept", "dropped"], rows)


NOT_RECORDED = "not recorded (a store made before provenance was recorded)"
"""What ``origin_words`` says of a document whose store records no provenance."""


def origin_words(origin: Origin | None) -> str:
    """Where a document came from and its id, in a few words on one line (control characters
    escaped): ``data/web.jsonl:17, id a-17``; ``NOT_RECORDED`` where its store records none."""
    if origin is None:
        return NOT_RECORDED
    return escaped(origin.where) + ("" if origin.id is None else f", id {escaped(origin.id)}")


def plan_text(plan: Plan) -> str:
    """``tokentape plan``: the plan's identity and its repeat table (a plan in phases: the
    whole run's, then each phase's)."""
    head = key_values(
        [
            ("seq_len", fmt_int(plan.seq_len)),
            ("seed", str(plan.seed)),
            (
                "horizon",
                f"{fmt_int(plan.horizon_samples)} samples = "
                f"{fmt_int(plan.horizon_samples * plan.seq_len)} tokens",
            ),
            *([("phases", f"{len(plan.phases) + 1} (each below)")] if plan.phases else []),
            ("weights", _weights_line(plan)),
            ("index hash", plan.index_hash),
        ]
    )
    tape = plan.tape()
    cut = [excisions_text(plan)] if plan.excisions else []
    if not plan.phases:
        return "\n\n".join([head, _shares_table(plan, tape, 0, extra=True), *cut])
    rows = [
        [s.name, s.n_tokens, s.n_samples, s.draws, f"{s.passes:.3f}", f"{s.max_repeats:g}",
         s.draws * plan.seq_len]
        for s in plan.sources
    ]  # fmt: skip
    header = ["source", "tokens", "samples", "draws", "passes", "budget", "tokens trained"]
    parts = [head, "  whole run\n" + table(header, rows)]
    for i, (start, end) in enumerate(plan.phase_spans):
        span = (
            f"  phase {i + 1}: samples [{fmt_int(start)}, {fmt_int(end)}) = "
            f"{fmt_int((end - start) * plan.seq_len)} tokens, exact rationals over "
            f"{fmt_int(plan.phase_denominators[i])}"
        )
        parts.append(span + "\n" + _shares_table(plan, tape, i))
    return "\n\n".join([*parts, *cut])


def excisions_text(plan: Plan) -> str:
    """What the plan's excisions left out (each: from where, how many samples of each
    source, what), and the share each source now has of the horizon's samples. The repeat
    table's draws and passes above count only the samples trained."""
    rows = []
    for i, e in enumerate(plan.excisions, start=1):
        removed = ", ".join(f"{n} {fmt_int(c)}" for n, c in e.removed)
        rows.append([i, fmt_int(e.from_consumed), fmt_int(e.first), fmt_int(e.count), removed,
                     escaped(e.what)])  # fmt: skip
    header = ["#", "from consumed", "first left out", "samples", "per source", "what"]
    total = plan.horizon_samples
    shares = ", ".join(f"{s.name} {fmt_int(s.draws)} ({s.draws / total:.4%})" for s in plan.sources)
    return (
        "  excisions (samples left out; the tape is the blend's without them)\n"
        + table(header, rows)
        + f"\n  samples trained over the horizon, after them: {shares}"
    )


def _stated(plan: Plan, phase: int) -> list[Fraction]:
    """Phase ``phase``'s stated weights (0: the sources' own), exactly."""
    if phase == 0:
        return [stated_value(s.weight) for s in plan.sources]
    return [stated_value(w) for w in plan.phases[phase - 1].weights]


def _shares_table(plan: Plan, tape: Tape, phase: int, extra: bool = False) -> str:
    """A phase's target and effective shares and its draws; ``extra``: a plan in one phase,
    with the store sizes, budgets and tokens trained too."""
    stated = _stated(plan, phase)
    total = sum(stated)
    units, den = plan.phase_units[phase], plan.phase_denominators[phase]
    start, end = plan.phase_spans[phase]
    rows = []
    for d, s in enumerate(plan.sources):
        draws = s.draws if extra else int(tape.blend.count(d, end) - tape.blend.count(d, start))
        shares = [f"{float(stated[d] / total):.4%}", f"{units[d]}/{den} = {units[d] / den:.4%}"]
        if extra:
            rows.append([s.name, s.n_tokens, s.n_samples, *shares, draws, f"{s.passes:.3f}",
                         f"{s.max_repeats:g}", draws * plan.seq_len])  # fmt: skip
        else:
            rows.append([s.name, *shares, draws, f"{draws / s.n_samples:.3f}"])
    header = ["source", "target", "effective share", "draws", "passes"]
    if extra:
        header = ["source", "tokens", "samples", *header[1:], "budget", "tokens trained"]
    return table(header, rows)


def _weights_line(plan: Plan) -> str:
    """How the stated weights became the plan's: exactly, or rounded over the period."""
    units = plan.phase_units
    dens = plan.phase_denominators
    rounded = [
        i + 1
        for i in range(len(units))
        if any(
            Fraction(u, dens[i]) != w / sum(_stated(plan, i))
            for u, w in zip(units[i], _stated(plan, i), strict=True)
        )
    ]
    how = "the stated weights exactly" if not rounded else "the stated weights rounded (see target)"
    if not plan.phases:
        return f"exact rationals over {fmt_int(plan.denominator)}: {how}"
    where = "" if not rounded else " in phase " + ", ".join(map(str, rounded))
    return f"exact rationals per phase: {how}{where}"


__all__ = ["dropped_text", "manifest_text", "plan_text"]
