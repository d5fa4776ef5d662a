"""``--overwrite`` replaces an output atomically for readers: a reader opening the store in a
tight loop while ``tokenize --overwrite`` / ``convert --from megatron --overwrite`` replace it
again and again finds the complete old store or the complete new one, never no store and never
a mixture; a Megatron prefix (two files) is never read as a silent mix of old and new; and a
reader that already has the old store open keeps reading it."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import shutil
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from helpers import make_documents, run_cli, tree_bytes, write_jsonl

from tokentape import TokentapeError, open_source
from tokentape._src.megatron.source import MegatronSource
from tokentape._src.program import main
from tokentape._src.store.atomic import atomic_writer, exchange, replace_directory
from tokentape._src.store.format import MANIFEST_NAME
from tokentape._src.store.reader import TokenStream
from tokentape.errors import WriteFailed

SETTINGS = {  # two stores of one corpus with different shard cuts: a mix cannot pass unseen
    "a": ("--unit-mb", "0.05", "--shard-mb", "0.05"),
    "b": ("--unit-mb", "0.05", "--shard-mb", "0.08", "--filter", "min-tokens:5"),
}
ROUNDS = 6


def token_sha(src: TokenStream) -> str:
    return hashlib.sha256(src.tokens(0, src.n_tokens).tobytes()).hexdigest()


class Reader(threading.Thread):
    """Opens ``open_()`` in a tight loop until stopped; records what each open saw."""

    def __init__(self, open_: Callable[[], TokenStream], key: Callable[[TokenStream], str]):
        super().__init__(daemon=True)
        self.open_, self.key = open_, key
        self.stop = threading.Event()
        self.seen: Counter[str] = Counter()  # identity of each store read whole
        self.shas: dict[str, set[str]] = {}
        self.errors: list[str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                src = self.open_()
                identity, sha = self.key(src), token_sha(src)
            except TokentapeError as exc:
                self.errors.append(str(exc))
                continue
            self.seen[identity] += 1
            self.shas.setdefault(identity, set()).add(sha)


class Prober(threading.Thread):
    """Checks that ``path`` exists, as often as it can, until stopped (a reader's first
    step, sampled far more densely than whole opens can be)."""

    def __init__(self, path: Path):
        super().__init__(daemon=True)
        self.path = path
        self.stop = threading.Event()
        self.checks = self.missing = 0

    def run(self) -> None:
        while not self.stop.is_set():
            for _ in range(1000):
                self.missing += not os.path.exists(self.path)
            self.checks += 1000


@contextmanager
def watched(path: Path, reader: Reader) -> Iterator[Prober]:
    prober = Prober(path)
    reader.start()
    prober.start()
    try:
        yield prober
    finally:
        for thread in (reader, prober):
            thread.stop.set()
            thread.join()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("overwrite-corpus") / "c.jsonl"
    write_jsonl(path, [json.dumps({"text": t}) for t in make_documents(3000, seed=4)])
    return path


@pytest.fixture(scope="module")
def expected(corpus, tmp_path_factory) -> dict[str, str]:
    """content hash -> token sha256 of the two stores."""
    found = {}
    for name, settings in SETTINGS.items():
        out = tmp_path_factory.mktemp(f"ref-{name}") / "s"
        assert main(["tokenize", str(corpus), "--out", str(out), *settings, "--json"]) == 0
        src = open_source(out)
        found[src.manifest.content_hash] = token_sha(src)
    assert len(found) == 2
    return found


def check_reader(reader: Reader, prober: Prober, expected: dict[str, str]) -> None:
    """Every open saw one of the two stores whole; none found no store at all."""
    assert prober.checks > 0 and prober.missing == 0, (prober.missing, prober.checks)
    missing = [e for e in reader.errors if "no manifest" in e or "no such directory" in e]
    assert not missing, missing[:3]
    for identity, shas in reader.shas.items():
        assert identity in expected and shas == {expected[identity]}, (identity, shas)
    assert all(reader.seen[h] > 0 for h in expected), reader.seen
    # An open that overlapped the swap took every file from one directory (the old one as it
    # was removed: then it opened the new one), so no open failed, not even mid-way.
    assert not reader.errors, reader.errors[:3]


@pytest.mark.subprocess
@pytest.mark.slow
def test_tokenize_overwrite_never_shows_a_reader_no_store_or_a_mixture(corpus, expected, tmp_path):
    out = tmp_path / "s"
    args = ["tokenize", str(corpus), "--out", str(out), "--json"]
    assert main([*args, *SETTINGS["a"]]) == 0
    reader = Reader(lambda: open_source(out), lambda s: s.manifest.content_hash)
    with watched(out / MANIFEST_NAME, reader) as prober:
        for i in range(ROUNDS):
            result = run_cli(*args, *SETTINGS["b" if i % 2 == 0 else "a"], "--overwrite")
            assert result.returncode == 0, result.stderr
            assert json.loads(result.stdout)["status"] == "created"
    check_reader(reader, prober, expected)
    assert sorted(os.listdir(tmp_path)) == ["s"]  # no staging directory, no lock file left


@pytest.mark.slow
def test_a_store_open_before_the_overwrite_keeps_reading_the_old_one(corpus, tmp_path):
    out = tmp_path / "s"
    args = ["tokenize", str(corpus), "--out", str(out), "--json"]
    assert main([*args, *SETTINGS["a"]]) == 0
    old = open_source(out)
    assert main([*args, *SETTINGS["b"], "--overwrite"]) == 0
    reference = tmp_path / "ref"
    assert main(["tokenize", str(corpus), "--out", str(reference), *SETTINGS["a"]]) == 0
    ref = open_source(reference)
    assert open_source(out).manifest.content_hash != old.manifest.content_hash
    assert token_sha(old) == token_sha(ref)
    for i in (0, 17, old.n_docs - 1):  # document starts and text: the old store's
        assert np.array_equal(old.doc(i), ref.doc(i))
        assert old.decode(old.doc(i)) == ref.decode(ref.doc(i))


@pytest.mark.subprocess
@pytest.mark.slow
def test_an_interrupted_overwrite_resumes_and_leaves_nothing_beside(corpus, tmp_path):
    out = tmp_path / "s"
    args = ["tokenize", str(corpus), "--out", str(out), "--json"]
    assert main([*args, *SETTINGS["a"]]) == 0
    before = open_source(out).manifest.content_hash
    for point in ("after-unit", "after-manifest"):
        killed = run_cli(*args, *SETTINGS["b"], "--overwrite", env={"TOKENTAPE_CRASH_AT": point})
        assert killed.returncode == -9
        assert open_source(out).manifest.content_hash == before  # the old store, whole
        rerun = run_cli(*args, *SETTINGS["b"], "--overwrite")
        assert rerun.returncode == 0, rerun.stderr
        assert json.loads(rerun.stdout)["status"] == "resumed"
        assert open_source(out).manifest.content_hash != before
        assert sorted(os.listdir(tmp_path)) == ["s"]
        assert main([*args, *SETTINGS["a"], "--overwrite"]) == 0


def megatron_prefix(tmp_path: Path, name: str, docs: list[list[int]]) -> Path:
    store = tmp_path / f"store-{name}"
    write_jsonl(tmp_path / f"{name}.jsonl", [json.dumps({"text": "x" * len(d)}) for d in docs])
    assert main(["tokenize", str(tmp_path / f"{name}.jsonl"), "--out", str(store)]) == 0
    prefix = tmp_path / f"mega-{name}"
    assert main(["convert", "--to", "megatron", str(store), str(prefix), "--json"]) == 0
    return prefix


@pytest.mark.subprocess
@pytest.mark.slow
def test_convert_from_megatron_overwrite_is_atomic_for_readers(tmp_path, capsys):
    prefixes = {
        "a": megatron_prefix(tmp_path, "a", [[0] * (n % 50 + 1) for n in range(4000)]),
        "b": megatron_prefix(tmp_path, "b", [[0] * (n % 70 + 1) for n in range(3000)]),
    }
    out = tmp_path / "stores" / "web"
    vocab = ["--vocab-size", "257", "--eod-id", "256", "--shard-mb", "0.02"]
    expected = {}
    for name, prefix in prefixes.items():
        ref = tmp_path / f"ref-{name}"
        assert main(["convert", "--from", "megatron", str(prefix), str(ref), *vocab]) == 0
        expected[open_source(ref).manifest.content_hash] = token_sha(open_source(ref))
    assert main(["convert", "--from", "megatron", str(prefixes["a"]), str(out), *vocab]) == 0
    reader = Reader(lambda: open_source(out), lambda s: s.manifest.content_hash)
    with watched(out / MANIFEST_NAME, reader) as prober:
        for i in range(ROUNDS):
            prefix = prefixes["b" if i % 2 == 0 else "a"]
            result = run_cli("convert", "--from", "megatron", str(prefix), str(out), *vocab)
            assert result.returncode == 2 and "--overwrite" in result.stderr
            result = run_cli(
                "convert", "--from", "megatron", str(prefix), str(out), *vocab, "--overwrite"
            )
            assert result.returncode == 0, result.stderr
    capsys.readouterr()
    check_reader(reader, prober, expected)
    assert sorted(os.listdir(out.parent)) == ["web"]


@pytest.mark.subprocess
@pytest.mark.slow
def test_a_megatron_prefix_is_never_read_as_a_silent_mix(tmp_path):
    """Two files cannot be replaced in one step: a reader opening between the two renames
    may be refused (a missing or mismatched ``.idx``), but it never reads tokens that are
    neither the old dataset's nor the new one's."""
    stores = {}
    for name, n in (("a", 40), ("b", 55)):
        write_jsonl(
            tmp_path / f"{name}.jsonl",
            [json.dumps({"text": "y" * (k % n + 1)}) for k in range(3000)],
        )
        stores[name] = tmp_path / f"store-{name}"
        assert main(["tokenize", str(tmp_path / f"{name}.jsonl"), "--out", str(stores[name])]) == 0
    prefix = tmp_path / "out" / "web"
    expected = {}
    for name, store in stores.items():
        ref = tmp_path / f"ref-{name}"
        assert main(["convert", "--to", "megatron", str(store), str(ref)]) == 0
        expected[name] = token_sha(MegatronSource(ref, 257, 256, identify=False))
    assert main(["convert", "--to", "megatron", str(stores["a"]), str(prefix)]) == 0
    reader = Reader(
        lambda: MegatronSource(prefix, 257, 256, identify=False),
        lambda s: str(s.n_tokens),
    )
    reader.start()
    try:
        for i in range(ROUNDS):
            store = stores["b" if i % 2 == 0 else "a"]
            result = run_cli("convert", "--to", "megatron", str(store), str(prefix), "--overwrite")
            assert result.returncode == 0, result.stderr
    finally:
        reader.stop.set()
        reader.join()
    valid = set(expected.values())
    for shas in reader.shas.values():
        assert shas <= valid, shas
    assert sum(reader.seen.values()) > 0


def test_exchange_swaps_two_directories_in_one_step(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "from-a").write_text("a")
    (b / "from-b").write_text("b")
    assert exchange(a, b)  # Linux with glibc >= 2.28 on ext4/tmpfs/xfs/btrfs
    assert os.listdir(a) == ["from-b"] and os.listdir(b) == ["from-a"]
    assert replace_directory(a, b) and os.listdir(b) == ["from-b"] and not a.exists()


# --- atomic file writes name their destination --------------------------------------------


def test_plan_out_an_existing_directory_names_it_and_leaves_no_temporary(tmp_path, capsys):
    data = write_jsonl(tmp_path / "d.jsonl", [json.dumps({"text": "hello world"})] * 50)
    assert main(["tokenize", str(data), "--out", str(tmp_path / "web")]) == 0
    (tmp_path / "mix.toml").write_text(
        'seq_len = 8\nseed = 1\ntotal_samples = 10\n[[source]]\nname = "web"\npath = "web"\n'
        "weight = 1\nmax_repeats = 100.0\n"
    )
    (tmp_path / "taken").mkdir()
    before = sorted(os.listdir(tmp_path))
    capsys.readouterr()
    code = main(["plan", str(tmp_path / "mix.toml"), "--out", str(tmp_path / "taken")])
    err = capsys.readouterr().err
    assert code == 2 and err == f"tokentape: error: '{tmp_path / 'taken'}': Is a directory\n"
    assert sorted(os.listdir(tmp_path)) == before and os.listdir(tmp_path / "taken") == []


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("a-directory", "Is a directory"),
        ("no-parent", "No such file or directory"),
        ("disk-full", "No space left on device"),
    ],
)
def test_atomic_writer_errors_name_the_destination(case, expected, tmp_path):
    target = tmp_path / ("missing/x.json" if case == "no-parent" else "x.json")
    if case == "a-directory":
        target.mkdir()
    with pytest.raises(WriteFailed) as caught, atomic_writer(target) as f:
        f.write(b"data")
        if case == "disk-full":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert str(caught.value) == f"'{target}': {expected}"
    assert isinstance(caught.value, TokentapeError) and isinstance(caught.value, OSError)
    assert caught.value.filename == str(target)
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]


def test_atomic_writer_lets_other_errors_through_and_removes_its_temporary(tmp_path):
    with pytest.raises(KeyError), atomic_writer(tmp_path / "x") as f:
        f.write(b"partial")
        raise KeyError("mine")
    with pytest.raises(FileNotFoundError) as caught, atomic_writer(tmp_path / "y"):
        open(tmp_path / "an-input-that-is-not-there")  # noqa: SIM115 - raises at once
    assert caught.value.filename == str(tmp_path / "an-input-that-is-not-there")
    assert os.listdir(tmp_path) == []


# --- --overwrite removes only what it can tell is tokentape's ---------------------------------

SOMEONE_ELSES = b"\x00\x01 another tool's part file, not a tokentape shard"


def npy(array: np.ndarray) -> bytes:
    path = io.BytesIO()
    np.save(path, array, allow_pickle=False)
    return path.getvalue()


def small_corpus(tmp_path: Path) -> Path:
    docs = [json.dumps({"text": t}) for t in make_documents(300, seed=9)]
    return write_jsonl(tmp_path / "small.jsonl", docs)


def one_error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("tokentape: error: "), err
    return err


def listing(directory: Path) -> tuple[list[str], dict[str, bytes]]:
    return sorted(os.listdir(directory)), tree_bytes(directory)


UNCLAIMED = {  # what is planted in --out; the file the refusal names first
    "beside-an-empty-manifest": ({"part-00000.bin": SOMEONE_ELSES, MANIFEST_NAME: b""}, "bin"),
    "alone": ({"part-00000.bin": SOMEONE_ELSES}, "bin"),
    "with-an-index-not-ours": (
        {
            "part-00000.bin": SOMEONE_ELSES,
            "part-00000.idx.npy": npy(np.arange(4, dtype=np.float32)),
            MANIFEST_NAME: b"",
        },
        "bin",
    ),
    "a-tokenizer-json": ({"tokenizer.json": b'{"model": "mine"}'}, "tokenizer"),
}


@pytest.mark.parametrize("case", sorted(UNCLAIMED))
def test_overwrite_never_deletes_a_store_file_it_cannot_tell_is_its_own(case, tmp_path, capsys):
    """A ``part-00000.bin`` is tokentape's only where a readable manifest names it, an
    unfinished run is there, or it is one of a shard's pair as the writer leaves them: here
    it is none, so neither a plain run nor ``--overwrite`` removes it, and neither suggests
    ``--overwrite``."""
    files, named = UNCLAIMED[case]
    out = tmp_path / "out"
    out.mkdir()
    for name, data in files.items():
        (out / name).write_bytes(data)
    before = listing(out)
    args = ["tokenize", str(small_corpus(tmp_path)), "--out", str(out)]
    for extra in ((), ("--overwrite",)):
        assert main([*args, *extra]) == 2
        line = one_error(capsys)
        expected = "'part-00000.bin'" if named == "bin" else "'tokenizer.json'"
        assert f"--out '{out}': holds {expected}" in line, line
        assert "move it away or choose another --out" in line and "pass --overwrite" not in line
        assert listing(out) == before  # byte for byte, nothing added, nothing removed


def test_overwrite_never_deletes_what_it_cannot_tell_is_its_own_in_the_staging_directory(
    tmp_path, capsys
):
    """A store of other settings is replaced by building beside it, in a hidden sibling: one
    that holds an unclaimed part file is refused before ``--overwrite`` is suggested."""
    out = tmp_path / "s"
    args = ["tokenize", str(small_corpus(tmp_path)), "--out", str(out)]
    assert main(args) == 0
    staging = tmp_path / ".s.tokentape-next"
    staging.mkdir()
    (staging / "part-00000.bin").write_bytes(SOMEONE_ELSES)
    (staging / MANIFEST_NAME).write_bytes(b"")
    before, store = listing(staging), listing(out)
    capsys.readouterr()
    for extra in ((), ("--overwrite",)):
        assert main([*args, "--shard-mb", "0.001", *extra]) == 2
        line = one_error(capsys)
        assert f"staging directory '{staging}': holds 'part-00000.bin'" in line, line
        assert "pass --overwrite" not in line
        assert listing(staging) == before and listing(out) == store


@pytest.mark.subprocess
def test_overwrite_still_replaces_its_own_unfinished_run_and_stores(
    tmp_path, capsys, hf_tokenizer_json
):
    """What is tokentape's is replaced as before: an unfinished run's part files (its job
    record is there), a store with a readable manifest, and a store whose manifest was
    damaged (its shard pairs and tokenizer copy are recognised)."""
    out = tmp_path / "s"
    corpus = small_corpus(tmp_path)
    args = ["tokenize", str(corpus), "--out", str(out), "--tokenizer", str(hf_tokenizer_json)]
    args += ["--unit-mb", "0.01", "--shard-mb", "0.002"]
    other = [*args, "--filter", "min-tokens:3"]
    killed = run_cli(*args, env={"TOKENTAPE_CRASH_AT": "before-manifest"})
    assert killed.returncode == -9, killed.stderr
    assert len([n for n in os.listdir(out) if n.startswith("part-")]) > 2
    assert not (out / MANIFEST_NAME).exists() and (out / ".tokentape-work/job.json").is_file()
    assert main(other) == 2
    assert "unfinished run with other inputs or settings" in one_error(capsys)

    def replaced_by(argv: list[str]) -> None:
        """``argv --overwrite`` succeeds, and leaves what a fresh run of ``argv`` makes."""
        assert main([*argv, "--overwrite"]) == 0
        reference = tmp_path / "reference"
        shutil.rmtree(reference, ignore_errors=True)
        assert main([*argv[:3], str(reference), *argv[4:]]) == 0
        assert listing(out) == listing(reference)

    replaced_by(other)  # the unfinished run
    replaced_by(args)  # a store with a readable manifest
    (out / MANIFEST_NAME).write_bytes(b"")
    assert main(other) == 2
    assert "pass --overwrite to replace the store" in one_error(capsys)
    replaced_by(other)  # a store whose manifest cannot be read


def test_convert_overwrite_never_deletes_a_part_file_it_cannot_tell_is_its_own(tmp_path, capsys):
    prefix = megatron_prefix(tmp_path, "a", [[0] * (n % 9 + 1) for n in range(40)])
    out = tmp_path / "out"
    out.mkdir()
    (out / "part-00000.bin").write_bytes(SOMEONE_ELSES)
    (out / MANIFEST_NAME).write_bytes(b"")
    before = listing(out)
    args = ["convert", "--from", "megatron", str(prefix), str(out), "--vocab-size", "257"]
    capsys.readouterr()
    for extra in ((), ("--overwrite",)):
        assert main([*args, "--eod-id", "256", *extra]) == 2
        line = one_error(capsys)
        assert f"'{out}': holds 'part-00000.bin'" in line and "move it away" in line, line
        assert "pass --overwrite" not in line
        assert listing(out) == before


def test_convert_to_megatron_suggests_overwrite_only_where_it_would_replace(tmp_path, capsys):
    """A ``model.bin`` that is no Megatron dataset is never replaced: the refusal without
    ``--overwrite`` says so at once instead of suggesting it."""
    store = tmp_path / "store"
    corpus = small_corpus(tmp_path)
    assert main(["tokenize", str(corpus), "--out", str(store)]) == 0
    model = tmp_path / "model.bin"
    model.write_bytes(b"weights" * 10)
    capsys.readouterr()
    for extra in ((), ("--overwrite",)):
        assert (
            main(["convert", "--to", "megatron", str(store), str(tmp_path / "model"), *extra]) == 2
        )
        line = one_error(capsys)
        assert "refusing to replace it" in line and "pass --overwrite" not in line, line
        assert model.read_bytes() == b"weights" * 10
    prefix = megatron_prefix(tmp_path, "b", [[0] * 3] * 10)  # a Megatron dataset: replaced
    assert main(["convert", "--to", "megatron", str(store), str(prefix)]) == 2
    assert "pass --overwrite" in one_error(capsys)
    assert main(["convert", "--to", "megatron", str(store), str(prefix), "--overwrite"]) == 0
