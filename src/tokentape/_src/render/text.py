"""Plain-text views of a manifest and a plan, for the command-line program and the demo."""

from __future__ import annotations

from fractions import Fraction

from tokentape._src.plan.plan import Plan
from tokentape._src.store.format import Manifest, numpy_dtype
from tokentape._src.tape.blend import stated_value
from tokentape._src.util.text import fmt_bytes, fmt_int, key_values, table


def dropped_text(docs: dict[str, int], tokens: dict[str, int]) -> str:
    if not docs:
        return "none"
    return "; ".join(
        f"{name}: {fmt_int(n)} docs, {fmt_int(tokens.get(name, 0))} tokens"
        for name, n in docs.items()
    )


def manifest_text(directory: str, m: Manifest) -> str:
    """``tokentape info``: a manifest in human form."""
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
            ("fingerprint", tok.get("fingerprint", "?")),
            ("content hash", m.content_hash),
            ("filters", filters or "none"),
            ("documents read", fmt_int(stats.get("docs_in", m.n_docs))),
            (
                "dropped",
                dropped_text(stats.get("dropped_docs", {}), stats.get("dropped_tokens", {})),
            ),
            ("input files", fmt_int(len(m.inputs.get("files", [])))),
        ]
    )
    shards = table(
        ["shard", "tokens", "docs", "bin sha256"],
        [[s.name, s.n_tokens, s.n_docs, s.bin_sha256[:16]] for s in m.shards],
    )
    return f"{head}\n\n{shards}"


def plan_text(plan: Plan) -> str:
    """``tokentape plan``: the plan's identity and its repeat table."""
    stated = [stated_value(s.weight) for s in plan.sources]
    total_weight = sum(stated)
    head = key_values(
        [
            ("seq_len", fmt_int(plan.seq_len)),
            ("seed", str(plan.seed)),
            (
                "horizon",
                f"{fmt_int(plan.horizon_samples)} samples = "
                f"{fmt_int(plan.horizon_samples * plan.seq_len)} tokens",
            ),
            ("weights", _weights_line(plan)),
            ("index hash", plan.index_hash),
        ]
    )
    rows = [
        [
            s.name,
            s.n_tokens,
            s.n_samples,
            f"{float(w / total_weight):.4%}",
            f"{s.weight_units}/{plan.denominator} = {s.weight_units / plan.denominator:.4%}",
            s.draws,
            f"{s.passes:.3f}",
            f"{s.max_repeats:g}",
            s.draws * plan.seq_len,
        ]
        for s, w in zip(plan.sources, stated, strict=True)
    ]
    header = [
        "source", "tokens", "samples", "target", "effective share", "draws", "passes",
        "budget", "tokens trained",
    ]  # fmt: skip
    return f"{head}\n\n{table(header, rows)}"


def _weights_line(plan: Plan) -> str:
    """How the stated weights became the plan's: exactly, or rounded over the period."""
    stated = [stated_value(s.weight) for s in plan.sources]
    total = sum(stated)
    exact = all(
        Fraction(s.weight_units, plan.denominator) == w / total
        for s, w in zip(plan.sources, stated, strict=True)
    )
    how = "the stated weights exactly" if exact else "the stated weights rounded (see target)"
    return f"exact rationals over {fmt_int(plan.denominator)}: {how}"
