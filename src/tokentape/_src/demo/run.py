"""``tokentape demo``: the end-to-end story on the built-in corpora, with section headings."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from tokentape._src.cli.progress import terminal_bar
from tokentape._src.corpora import write_builtin_corpora
from tokentape._src.demo.anneal import anneal_story
from tokentape._src.demo.audit import loss_spike_story, retokenize_story
from tokentape._src.demo.excise import excise_story
from tokentape._src.demo.report import report_story
from tokentape._src.demo.train import CHECKPOINT_EVERY, Phase, simulate_training
from tokentape._src.plan.plan import check_budgets, resolve_plan
from tokentape._src.plan.spec import load_plan_spec
from tokentape._src.render.plot import plot_plan, plt
from tokentape._src.render.text import plan_text
from tokentape._src.store.atomic import write_atomic
from tokentape._src.store.reader import Source
from tokentape._src.tokenize.driver import TokenizeSummary, tokenize
from tokentape._src.tokenize.inputs import expand_inputs, plan_units, read_documents
from tokentape._src.tokenize.job import TokenizeConfig
from tokentape._src.train.partition import BatchConfig
from tokentape._src.util.text import fmt_int, table
from tokentape.errors import TokentapeError

EOD = "<|endoftext|>"
DEMO_VOCAB = 8192
DEMO_SEQ_LEN = 256


DEMO_BUDGETS = {"prose": 5, "code": 2, "notes": 30}
DEMO_STEPS = 60


def demo_plan_toml(max_repeats: Mapping[str, float]) -> str:
    """A mixture of the built-in stores: prose 50, code 40, notes 10; 4M tokens of 256."""
    weights = {"prose": 50, "code": 40, "notes": 10}
    head = f'seq_len = {DEMO_SEQ_LEN}\nseed = 1234\ntotal_tokens = "4M"\n'
    blocks = [
        f'\n[[source]]\nname = "{name}"\npath = "stores/{name}"\nweight = {w}\n'
        f"max_repeats = {max_repeats[name]}\n"
        for name, w in weights.items()
    ]
    return head + "".join(blocks)


def heading(n: int, title: str) -> None:
    print(f"\n== {n}. {title} " + "=" * max(0, 72 - len(title)))


def corpus_texts(directories: list[Path]) -> Iterator[str]:
    files = expand_inputs([str(d) for d in directories])
    for unit in plan_units(files, 2**30):
        for part in unit.parts:
            yield from read_documents(part, "text")


def train_bpe(texts: Iterator[str], vocab_size: int, path: Path) -> Path:
    """A byte-level BPE trained on ``texts`` with ``<|endoftext|>`` as its only special token."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.save(str(path))
    return path


def _row(name: str, s: TokenizeSummary) -> list[object]:
    dropped = sum(s.dropped_docs.values())
    return [name, s.docs_in, s.n_docs, dropped, s.n_tokens, s.n_shards, round(s.seconds, 1)]


def run_demo(out: str, workers: int) -> int:
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    heading(1, "Built-in corpora (Python's own documentation and sources)")
    sources = write_builtin_corpora(root / "corpora")
    for name, directory in sources.items():
        n_files = len(expand_inputs([str(directory)]))
        print(f"  {name:<8} {directory}  ({n_files} files)")

    heading(2, f"Train a byte-level BPE tokenizer ({fmt_int(DEMO_VOCAB)} ids) on them")
    tok_path = root / "tokenizer.json"
    if not tok_path.exists():
        train_bpe(corpus_texts(list(sources.values())), DEMO_VOCAB, tok_path)
    print(f"  {tok_path}")

    heading(3, f"Tokenize each source ({workers} workers, repetition filter OFF)")
    print("  (as the run in the article did: only empty documents are dropped)\n")
    rows, stores = [], {}
    for name, directory in sources.items():
        config = _tokenize_config(directory, root / "stores" / name, tok_path, workers)
        summary = tokenize(config, progress=terminal_bar())
        rows.append(_row(name, summary))
        stores[name] = summary
    header = ["source", "docs read", "kept", "dropped", "tokens", "shards", "seconds"]
    print(table(header, rows))

    heading(4, "Same bytes whatever the worker count")
    prose = stores["prose"]
    one = _tokenize_config(sources["prose"], root / "stores" / "prose-1-worker", tok_path, 1)
    again = tokenize(one)
    same = again.content_hash == prose.content_hash
    print(f"  {workers} workers: {prose.content_hash}")
    print(f"  1 worker : {again.content_hash}")
    print(f"  identical: {'yes' if same else 'NO'}")

    heading(5, f"Read a store: samples of {DEMO_SEQ_LEN} + 1 tokens")
    src = Source(root / "stores" / "prose")
    n = src.n_samples(DEMO_SEQ_LEN)
    print(f"  {src}")
    print(f"  samples at seq_len {DEMO_SEQ_LEN}: {fmt_int(n)}")
    for k in (0, n // 2, n - 1):
        docs = src.docs_in(k, DEMO_SEQ_LEN)
        preview = src.decode(src.window(k, DEMO_SEQ_LEN)[:24]).replace("\n", " ")
        print(f"  sample {k:>6}: documents {docs}  '{preview}...'")

    heading(6, "Plan a mixture: repeat table and index hash")
    plan_path = root / "plan.toml"
    plan_path.write_text(demo_plan_toml(max_repeats={"prose": 1, "code": 1, "notes": 1}))
    try:
        check_budgets(resolve_plan(load_plan_spec(plan_path), str(plan_path)), str(plan_path))
    except TokentapeError as exc:
        print(f"  with max_repeats = 1 everywhere the plan is refused:\n    {exc}")
    plan_path.write_text(demo_plan_toml(max_repeats=DEMO_BUDGETS))
    plan = resolve_plan(load_plan_spec(plan_path), str(plan_path))
    check_budgets(plan, str(plan_path))
    write_atomic(root / "plan.json", plan.to_json().encode())
    print(f"  with the budgets signed off in {plan_path}:\n")
    print(plan_text(plan))
    tape = plan.tape()
    first = tape.resolve(np.arange(16))
    names = [plan.sources[d].name for d in first.source]
    print("\n  the first 16 positions of the tape (source:sample):")
    print("    " + " ".join(f"{n}:{k}" for n, k in zip(names, first.sample.tolist(), strict=True)))
    print(f"  resolved plan written to {root / 'plan.json'}")
    if plt is not None:
        plot_plan(plan, root / "plan.png")
        print(f"  shares and repeats drawn in {root / 'plan.png'}")

    heading(7, "Train on 4 simulated ranks, crash, resume elastically on 2, then 8")
    phases = [
        Phase(BatchConfig(4, 4, 2), until_step=24, crash=True),
        Phase(BatchConfig(2, 4, 4), until_step=46, crash=True),
        Phase(BatchConfig(8, 2, 2), until_step=DEMO_STEPS, crash=False),
    ]
    print(f"  checkpoint (data state) every {CHECKPOINT_EVERY} steps; global batch kept at 32")
    print("  the loss is a stand-in, not a model: a decaying curve + noise, and each window of")
    print("  near-total repetition adds 2 to its row's loss (8 when more than 1 in 8 of the")
    print("  step's windows are: a burst)\n")
    trained = simulate_training(plan, root, phases)

    spike = loss_spike_story(root, plan, trained)
    excised = excise_story(12, root, plan, trained, spike)
    refused = retokenize_story(13, root, plan, trained, spike, sources["prose"], tok_path, workers)
    annealed = anneal_story(root, plan, trained)
    drawn = report_story(15, root, trained, spike)

    print(f"\nDemo finished in {time.monotonic() - started:.1f} s; outputs under {root}/")
    story = spike.ok and excised and refused
    return 0 if same and trained.ok and story and annealed and drawn else 1


def _tokenize_config(
    inputs: Path, out: Path, tokenizer: Path, workers: int, filters: tuple[str, ...] = ()
) -> TokenizeConfig:
    return TokenizeConfig(
        inputs=(str(inputs),),
        out=str(out),
        tokenizer=str(tokenizer),
        filters=filters,
        workers=workers,
    )


__all__ = [
    "DEMO_BUDGETS",
    "DEMO_VOCAB",
    "corpus_texts",
    "demo_plan_toml",
    "heading",
    "run_demo",
    "train_bpe",
]
