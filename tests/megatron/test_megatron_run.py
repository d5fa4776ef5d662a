"""Replaying and locating a Megatron-LM run from its data cache, against megatron-core itself.

Every cache here is built by megatron-core's own ``BlendedMegatronDatasetBuilder`` over
prefixes its ``IndexedDatasetBuilder`` wrote; the expected tokens are what its datasets return
(``dataset[g]["tokens"]``) and the expected document lists what its GPTDataset reports for each
sample (with the extra token every document it lists gives the sample at least one token;
without it megatron-core also lists a document a sample starts exactly at the end of, which
reads none of it and which tokentape leaves out); the batch-size schedules are checked
against its num-microbatches calculators.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import warnings
from collections import defaultdict
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from helpers import cli

from tokentape._src.audit.megatron_locate import dataset_map, landings
from tokentape._src.audit.megatron_replay import Shape, replay_iteration
from tokentape._src.audit.replay import EOD_MARK
from tokentape._src.megatron.iterations import BatchSchedule, Rampup, read_megatron_log
from tokentape._src.megatron.select import RunQuery, open_run

with warnings.catch_warnings():  # megatron-core warns that Apex / Transformer Engine are absent
    warnings.simplefilter("ignore")
    builder_mod = pytest.importorskip("megatron.core.datasets.blended_megatron_dataset_builder")
    gpt_mod = pytest.importorskip("megatron.core.datasets.gpt_dataset")
    indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    calculators = pytest.importorskip("megatron.core.num_microbatches_calculator")
torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.megatron, pytest.mark.torch]

VOCAB, EOD, SEQ_LEN = 1000, 999, 32
SIZES = {"web": 300, "code": 120, "math": 25}
"""Documents per prefix: math is small, so the run reads it over many epochs."""


class _Tokenizer:
    """What megatron-core's GPTDataset needs of a tokenizer (no pad id: it pads with -1)."""

    unique_identifiers: ClassVar[dict[str, object]] = {"class": "TestTokenizer", "vocab": VOCAB}
    vocab_size = VOCAB
    eod = EOD

    @property
    def pad(self) -> int:
        raise NotImplementedError


def _process_group(tmp: Path) -> None:
    """megatron-core's blend asks for the rank: a one-process gloo group (a file rendezvous)."""
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(
            "gloo", init_method=f"file://{tmp / 'rendezvous'}", rank=0, world_size=1
        )


def _write_prefixes(root: Path, seed: int = 0) -> list[Path]:
    rng = np.random.default_rng(seed)
    prefixes = []
    for name, n in SIZES.items():
        prefix = root / name
        b = indexed.IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
        for _ in range(n):
            doc = np.append(rng.integers(0, EOD, int(rng.integers(2, 70))), EOD)
            b.add_document(torch.from_numpy(doc.astype(np.int64)), [len(doc)])
        b.finalize(f"{prefix}.idx")
        prefixes.append(prefix)
    return prefixes


def _build(prefixes, weights, sizes, cache, extra=True, split="90,5,5", seed=1234):
    config = gpt_mod.GPTDatasetConfig(
        random_seed=seed,
        sequence_length=SEQ_LEN,
        blend=([str(p) for p in prefixes], weights),
        split=split,
        path_to_cache=None if cache is None else str(cache),
        tokenizer=_Tokenizer(),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,
        add_extra_token_to_sequence=extra,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return builder_mod.BlendedMegatronDatasetBuilder(
            gpt_mod.GPTDataset, sizes, lambda: True, config
        ).build()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("mcore")
    _process_group(root)
    prefixes = _write_prefixes(root)
    blend = _build(prefixes, [0.5, 0.3, 0.2], [3000, 60, 60], root / "cache")
    return root, prefixes, blend


def _tokens(run, g):
    d, j = run.resolve(g)
    text, _ = run.datasets[d].text(j)
    return text[:-1] if run.extra_token else text


def _query(cache, prefixes, **kw):
    return RunQuery((Path(cache),), tuple(Path(p) for p in prefixes), **kw)


# --- global sample -> tokens ------------------------------------------------------------------


@pytest.mark.parametrize("split", ["train", "valid"])
def test_every_sample_of_a_blend_is_megatron_cores(world, split):
    root, prefixes, blend = world
    peer = blend[("train", "valid").index(split)]
    run = open_run(_query(root / "cache", prefixes, split=split))
    assert len(run) == len(peer) and not run.rebuilt
    for g in range(len(peer)):
        assert np.array_equal(_tokens(run, g), peer[g]["tokens"].numpy()), g
    # more samples than one epoch of the small prefix
    assert run.datasets[2].epochs > 1


def test_without_the_extra_token(world, tmp_path):
    _, prefixes, _ = world
    peer = _build(prefixes, [0.6, 0.4, 0.1], [500, 10, 10], tmp_path / "cache", extra=False)[0]
    run = open_run(_query(tmp_path / "cache", prefixes, extra_token=False))
    for g in range(len(peer)):
        got = _tokens(run, g)
        assert got.size == SEQ_LEN and np.array_equal(got, peer[g]["tokens"].numpy()), g


def test_a_single_dataset_over_many_epochs(world, tmp_path):
    _, prefixes, _ = world
    peer = _build(prefixes[2:], None, [400, 5, 5], tmp_path / "cache", split="100,0,0")[0]
    run = open_run(_query(tmp_path / "cache", prefixes[2:]))
    assert run.dataset_index is None and run.datasets[0].epochs > 5
    for g in range(len(peer)):
        assert np.array_equal(_tokens(run, g), peer[g]["tokens"].numpy()), g


def test_a_blend_never_saved_is_rebuilt_with_megatron_cores_rule(world, tmp_path):
    """Without --data-cache-path megatron-core keeps each prefix's arrays beside it and never
    saves the blend: tokentape rebuilds it from the weights and the samples asked for."""
    _, source, _ = world
    prefixes = []
    for p in source:  # a copy of the data: megatron-core writes PREFIX/cache/ beside it
        for ext in (".bin", ".idx"):
            shutil.copy(f"{p}{ext}", tmp_path / f"{p.name}{ext}")
        prefixes.append(tmp_path / p.name)
    peer = _build(prefixes, [2, 1, 1], [700, 10, 10], None)[0]
    first_cache = Path(f"{prefixes[0]}") / "cache" / "GPTDataset_indices"
    assert first_cache.is_dir()
    with pytest.raises(Exception, match="never saves its blend; give --weights and --samples"):
        open_run(_query(first_cache, prefixes))
    run = open_run(_query(first_cache, prefixes, weights=(2, 1, 1), samples=700))
    assert run.rebuilt and len(run) == 700 <= len(peer)  # the samples asked for
    assert np.array_equal(run.dataset_index, peer.dataset_index[:700])
    for g in range(0, len(run), 7):
        assert np.array_equal(_tokens(run, g), peer[g]["tokens"].numpy()), g


# --- iterations -> samples --------------------------------------------------------------------


def test_an_iterations_ranks_and_micro_batches(world):
    """Micro-batch m of rank r of iteration N: the samples megatron's sampler hands that rank
    (consecutive slices of mbs per rank, dp of them per micro-batch)."""
    root, prefixes, blend = world
    run = open_run(_query(root / "cache", prefixes))
    gbs, mbs, dp = 24, 3, 2
    for n in (1, 2, 7, 40):
        start = (n - 1) * gbs
        expected = defaultdict(list)
        for m in range(gbs // (mbs * dp)):
            batch = list(range(start + m * mbs * dp, start + (m + 1) * mbs * dp))
            for r in range(dp):
                expected[r] += batch[r * mbs : (r + 1) * mbs]
        for r in range(dp):
            it = replay_iteration(run, n, start, gbs, Shape(mbs, dp), rank=r)
            assert [s.g for s in it.samples] == expected[r]
            for s in it.samples:
                assert np.array_equal(s.tokens[:-1], blend[0][s.g]["tokens"].numpy())


@pytest.mark.parametrize(
    ("gbs", "rampup", "decrease", "mbs", "dp"),
    [
        (64, (8, 8, 1000), False, 4, 2),
        (62, (8, 6, 777), True, 4, 2),
        (48, None, True, 5, 2),
        (32, (16, 16, 1), False, 2, 2),
    ],
)
def test_the_batch_schedule_is_megatron_cores(gbs, rampup, decrease, mbs, dp):
    if rampup is None:
        calc = calculators.ConstantNumMicroBatchesCalculator(gbs, mbs, dp, decrease, 1)
    else:
        calc = calculators.RampupBatchsizeNumMicroBatchesCalculator(
            gbs, mbs, dp, decrease, 1, *rampup
        )
    ours = BatchSchedule(gbs, None if rampup is None else Rampup(*rampup), decrease, mbs, dp)
    consumed = 0
    for iteration in range(1, 300):
        calc.update(consumed, consistency_check=False)
        size = calc.get_current_running_global_batch_size()
        assert ours.consumed_before(iteration) == (consumed, size), iteration
        assert ours.iteration_of(consumed + size - 1) == (iteration, consumed, size)
        consumed += size


def test_iterations_from_a_training_log(tmp_path):
    """The consumed-samples column of a Megatron-LM log (its own line format), with a resume
    that logs iterations again and a ramp the lines show."""
    schedule = BatchSchedule(16, Rampup(4, 4, 100))
    lines, consumed = [], 0
    for it in range(1, 61):
        size = schedule.batch_at(consumed)
        consumed += size
        if it % 5 == 0 or it < 25:  # every line while the batch ramps up
            lines.append(
                f" [2026-01-01 00:00:00] iteration {it:8d}/{1000:8d} | consumed samples: "
                f"{consumed:12d} | elapsed time per iteration (ms): 1.0 | learning rate: "
                f"1.0E-04 | global batch size: {size:5d} | lm loss: 2.0E+00 |"
            )
    log = tmp_path / "train.log"
    log.write_text("\n".join(["noise", *lines, *lines[-3:]]) + "\n")
    logged = read_megatron_log(str(log))
    for it in range(1, 61):
        assert logged.consumed_before(it) == schedule.consumed_before(it), it
    for g in range(consumed):
        assert logged.iteration_of(g) == schedule.iteration_of(g), g
    with pytest.raises(Exception, match="past the log's last line"):
        logged.iteration_of(consumed)


# --- locate -----------------------------------------------------------------------------------


def test_locate_agrees_with_a_scan_of_every_sample(world, tmp_path):
    root, prefixes, blend = world
    train = blend[0]
    run = open_run(_query(root / "cache", prefixes))
    scan = defaultdict(list)  # (dataset, doc) -> global samples, by megatron-core's own ids
    for g in range(len(train)):
        d, j = int(train.dataset_index[g]), int(train.dataset_sample_index[g])
        _, docs = train.datasets[d]._query_document_sample_shuffle_indices(j)
        for doc in docs.tolist():
            scan[(d, doc)].append(g)
    for d in range(3):
        m, built = dataset_map(run, d, tmp_path)
        again, rebuilt = dataset_map(run, d, tmp_path)
        assert built and not rebuilt
        pairs = zip(m.__dict__.values(), again.__dict__.values(), strict=True)
        assert all(np.array_equal(a, b) for a, b in pairs)
        ds = run.datasets[d]
        for doc in range(ds.begin, ds.end):
            found = sorted(h.g for h in landings(run, d, doc, m) if h.g is not None)
            assert found == sorted(scan.get((d, doc), [])), (d, doc)


@pytest.mark.parametrize(
    ("name", "damage"),
    [
        ("inverse_shuffle", lambda a: a[::-1].copy()),
        ("global", lambda a: a + 1),
        ("starts", lambda a: a[:3].copy()),
        ("doc_order", lambda a: a[:0].copy()),
        ("doc_order", lambda a: np.roll(a, 1)),
    ],
)
def test_a_tampered_map_is_rebuilt_not_trusted(world, tmp_path, name, damage):
    """A map changed in --map-dir, its manifest's hash updated to match, is checked against
    the cache on reading and built again: never a wrong answer, never a crash."""
    root, prefixes, _ = world
    run = open_run(_query(root / "cache", prefixes))
    m, _ = dataset_map(run, 0, tmp_path)
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    path = folder / f"{name}.npy"
    np.save(path, damage(np.load(path)))
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["sha256"][name] = hashlib.sha256(path.read_bytes()).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest))
    again, built = dataset_map(run, 0, tmp_path)
    assert built
    pairs = zip(m.__dict__.values(), again.__dict__.values(), strict=True)
    assert all(np.array_equal(a, b) for a, b in pairs)


def test_links_and_fifos_in_the_map_folder(world, tmp_path):
    root, prefixes, _ = world
    run = open_run(_query(root / "cache", prefixes))
    dataset_map(run, 0, tmp_path)
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    # a link planted in the map folder is not followed (the map is rebuilt over it)
    target = tmp_path / "elsewhere.npy"
    target.write_bytes(b"keep")
    os.remove(folder / "starts.npy")
    os.symlink(target, folder / "starts.npy")
    _, built = dataset_map(run, 0, tmp_path)
    assert built and target.read_bytes() == b"keep"
    # a FIFO in place of the manifest is not waited on: the map is built again
    os.remove(folder / "manifest.json")
    os.mkfifo(folder / "manifest.json")
    _, built = dataset_map(run, 0, tmp_path)
    assert built


# --- the commands -----------------------------------------------------------------------------


def _args(root, prefixes):
    return [str(root / "cache")] + [a for p in prefixes for a in ("--prefix", str(p))]


def test_replay_command_json(world, capsys):
    root, prefixes, blend = world
    rc, out, err = cli(
        capsys,
        "megatron",
        "replay",
        *_args(root, prefixes),
        "--iteration",
        "5",
        "--global-batch",
        "16",
        "--micro-batch",
        "2",
        "--dp",
        "4",
        "--json",
        "--tokens",
    )
    assert rc == 0, err
    data = json.loads(out)
    assert [s["sample"] for s in data["samples"]] == list(range(64, 80))
    for s in data["samples"]:
        assert s["tokens"][:-1] == blend[0][s["sample"]]["tokens"].tolist()
        assert s["rank"] == (s["sample"] - 64) % 8 // 2
    assert data["top"] and data["top"][0]["samples"] >= data["top"][-1]["samples"]


def test_locate_command_keeps_its_map_only_where_told(world, tmp_path, capsys):
    root, prefixes, blend = world
    maps = tmp_path / "maps"
    maps.mkdir()
    before = sorted(p.name for p in (root / "cache").iterdir())
    args = [
        "megatron",
        "locate",
        *_args(root, prefixes),
        "--doc",
        "code:17",
        "--global-batch",
        "16",
        "--map-dir",
        str(maps),
        "--json",
    ]
    rc, out, err = cli(capsys, *args)
    assert rc == 0, err
    first = json.loads(out)
    assert first["map"]["built"] is True
    rc, out, _ = cli(capsys, *args)
    second = json.loads(out)
    assert second["map"]["built"] is False and second["landings"] == first["landings"]
    assert sorted(p.name for p in (root / "cache").iterdir()) == before
    train = blend[0]
    for hit in first["landings"]:
        g = hit["sample"]
        assert hit["iteration"] == g // 16 + 1
        d, j = int(train.dataset_index[g]), int(train.dataset_sample_index[g])
        _, docs = train.datasets[d]._query_document_sample_shuffle_indices(j)
        assert d == 1 and 17 in docs.tolist()


# --- bad caches: one line, exit code 2 ----------------------------------------------------------


@pytest.fixture
def copy(world, tmp_path):
    root, prefixes, _ = world
    shutil.copytree(root / "cache", tmp_path / "cache")
    return tmp_path, prefixes


def _replay(capsys, cache_root, prefixes, *extra):
    return cli(
        capsys,
        "megatron",
        "replay",
        *_args(cache_root, prefixes),
        "--iteration",
        "1",
        "--global-batch",
        "8",
        *extra,
    )


def _one_line_error(rc, out, err, pattern):
    assert rc == 2 and out == "", (rc, out)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert re.search(pattern, lines[0]), lines[0]


def _files(cache, pattern):
    return sorted(cache.glob(pattern))


def test_a_truncated_array_is_refused(copy, capsys):
    root, prefixes = copy
    path = _files(root / "cache", "*-GPTDataset-train-sample_index.npy")[0]
    path.write_bytes(path.read_bytes()[:-40])
    _one_line_error(*_replay(capsys, root, prefixes), r"sample_index\.npy: .*(unreadable|cannot)")


def test_swapped_arrays_are_refused(copy, capsys):
    root, prefixes = copy
    a, b = _files(root / "cache", "*-GPTDataset-train-sample_index.npy")[:2]
    data = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(data)
    _one_line_error(*_replay(capsys, root, prefixes), r"sample_index\.npy: .*not built from")


def test_a_pickled_array_is_refused_never_loaded(copy, capsys):
    root, prefixes = copy
    path = _files(root / "cache", "*-GPTDataset-train-shuffle_index.npy")[0]
    marker = root / "unpickled"
    np.save(path, np.array([_Boom(str(marker))], dtype=object), allow_pickle=True)
    _one_line_error(*_replay(capsys, root, prefixes), r"shuffle_index\.npy: .*pickled")
    assert not marker.exists()


class _Boom:
    """Unpickling it would create a file: the test checks nothing was unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def test_a_description_that_does_not_match_the_prefixes(copy, capsys):
    root, prefixes = copy
    order = r"give all its prefixes, in order \(--prefix web --prefix code --prefix math\)"
    wrong = [prefixes[1], prefixes[0], prefixes[2]]
    _one_line_error(*_replay(capsys, root, wrong), order)
    _one_line_error(*_replay(capsys, root, prefixes[:2]), order)
    # the right names, other data: the sample counts give it away
    other = root / "other"
    other.mkdir()
    moved = _write_prefixes(other, seed=7)
    _one_line_error(*_replay(capsys, root, moved), r"not built from")


def test_an_edited_description_is_refused(copy, capsys):
    root, prefixes = copy
    path = _files(root / "cache", "*-BlendedDataset-train-description.txt")[0]
    path.write_text(path.read_text().replace("1234", "1235"))
    _one_line_error(*_replay(capsys, root, prefixes), r"description\.txt: its content's md5")


def test_one_of_a_blends_datasets_alone_is_refused_unless_chosen(world, capsys):
    root, prefixes, _ = world
    rc, out, err = _replay(capsys, root, prefixes[:1])
    _one_line_error(rc, out, err, r"one of blend \w+'s datasets.*--prefix web --prefix code")
    md5 = re.search(r"--cache-id (\w+)", err).group(1)
    rc, out, err = _replay(capsys, root, prefixes[:1], "--cache-id", md5, "--json")
    assert rc == 0, err
    assert json.loads(out)["run"]["datasets"] == [str(prefixes[0])]


@pytest.mark.parametrize(
    ("damage", "pattern"),
    [
        (lambda p: p.write_bytes(b""), r"sample_index\.npy: not a \.npy file"),
        (lambda p: p.write_bytes(b"hello world, not numpy"), r"not a \.npy file"),
        (lambda p: (p.unlink(), os.mkfifo(p)), r"sample_index\.npy: not a regular file"),
        (
            lambda p: p.write_bytes(
                p.read_bytes()[:10]
                + b"{'descr': '<i8', 'fortran_order': False, 'shape': "
                b"(4611686018427387904, 4611686018427387904), }".ljust(p.read_bytes()[8] - 2)
                + b"\n"
            ),
            r"sample_index\.npy: ",
        ),
    ],
    ids=["empty", "not-npy", "fifo", "lying-shape"],
)
def test_a_damaged_array_file_is_one_line(copy, capsys, damage, pattern):
    root, prefixes = copy
    damage(_files(root / "cache", "*-GPTDataset-train-sample_index.npy")[0])
    _one_line_error(*_replay(capsys, root, prefixes), pattern)


def _rename_to_md5(path: Path, text: str) -> None:
    """Write ``text`` as a description named by its own md5 (so only its content is bad)."""
    md5 = hashlib.md5(text.encode()).hexdigest()
    path.unlink()
    (path.parent / (md5 + path.name[32:])).write_text(text)


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("[" * 100000 + "]" * 100000, r"not JSON \(RecursionError"),
        ('{"class": "BlendedDataset", "size": ' + "9" * 5000 + "}", r"not JSON"),
        ("{}", r"not the description of a BlendedDataset"),
    ],
    ids=["deep", "huge-number", "empty-object"],
)
def test_a_hostile_description_is_one_line(copy, capsys, text, pattern):
    root, prefixes = copy
    _rename_to_md5(_files(root / "cache", "*-BlendedDataset-train-description.txt")[0], text)
    _one_line_error(*_replay(capsys, root, prefixes), pattern)


def test_infinite_weights_in_a_description_are_refused(copy, capsys):
    root, prefixes = copy
    path = _files(root / "cache", "*-BlendedDataset-train-description.txt")[0]
    settings = json.loads(path.read_text())
    settings["weights"][0] = float("inf")
    _rename_to_md5(path, json.dumps(settings, indent=4))
    _one_line_error(*_replay(capsys, root, prefixes), r"'weights': expected positive finite")


@pytest.mark.parametrize(
    ("extra", "pattern"),
    [
        (["--consumed", "3", "--global-batch", "0"], r"--global-batch: expected a positive"),
        (["--weights", "1,1,1", "--samples", "100"], r"the cache holds this run's blend"),
        (["--weights", "nan,1,1", "--samples", "100"], r"--weights .*positive finite"),
        (["--cache-id", ""], r"--cache-id '': expected the start of an md5"),
        (["--micro-batch", "3", "--dp", "1"], r"not a multiple of --micro-batch 3"),
    ],
)
def test_bad_flags_are_one_line(world, capsys, extra, pattern):
    root, prefixes, _ = world
    args = [*_args(root, prefixes), "--iteration", "1", *extra]
    if "--global-batch" not in extra:
        args += ["--global-batch", "8"]
    _one_line_error(*cli(capsys, "megatron", "replay", *args), pattern)


@pytest.mark.parametrize("doc", ["math:²", "math:٣", "math:" + "9" * 5000, "math", "nope:1"])
def test_odd_document_names_are_one_line(world, capsys, doc):
    root, prefixes, _ = world
    args = ["megatron", "locate", *_args(root, prefixes), "--doc", doc, "--global-batch", "8"]
    _one_line_error(*cli(capsys, *args), r"--doc ")


def _log_line(it: int, consumed: int, batch: int) -> str:
    return (
        f" [2026-01-01 00:00:00] iteration {it:8d}/{1000:8d} | consumed samples: "
        f"{consumed:12d} | global batch size: {batch:5d} | lm loss: 2.0E+00 |"
    )


@pytest.mark.parametrize(
    ("lines", "pattern"),
    [
        (
            [_log_line(1, 0, 0)],
            r"line 1: iteration 1 with 0 samples consumed and a global batch of 0",
        ),
        ([_log_line(3, 2, 8)], r"line 1: .*not a training log's line"),
        ([_log_line(1, 8, 8), _log_line(2, 8, 8)], r"line 2: iteration 2 has consumed 8 samples"),
        (["iteration 1/ 10 | consumed samples: " + "9" * 5000 + " |"], r"no line 'iteration N/ M"),
    ],
)
def test_a_bad_training_log_is_one_line(world, tmp_path, capsys, lines, pattern):
    root, prefixes, _ = world
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n")
    args = ["megatron", "replay", *_args(root, prefixes), "--iteration", "1", "--log", str(log)]
    _one_line_error(*cli(capsys, *args), pattern)


def test_locate_with_a_log_shorter_than_the_cache(world, tmp_path, capsys):
    """A live run's log ends before the cache's horizon: the landings it covers get their
    iteration, the later ones are listed as not trained yet."""
    root, prefixes, _ = world
    log = tmp_path / "train.log"
    log.write_text("\n".join(_log_line(it, it * 8, 8) for it in range(1, 51)) + "\n")
    base = ["megatron", "locate", *_args(root, prefixes), "--doc", "math:3"]
    rc, out, err = cli(capsys, *base, "--global-batch", "8", "--json")
    assert rc == 0, err
    full = json.loads(out)["landings"]
    rc, out, err = cli(capsys, *base, "--log", str(log), "--json")
    assert rc == 0, err
    short = json.loads(out)["landings"]
    assert [h["sample"] for h in short] == [h["sample"] for h in full]
    for a, b in zip(short, full, strict=True):
        assert a["iteration"] == (b["iteration"] if b["sample"] < 400 else None)
    assert any(h["iteration"] is None for h in short) and any(h["iteration"] for h in short)
    rc, out, _ = cli(capsys, *base, "--log", str(log))
    assert rc == 0 and "past the log's last line: not trained yet" in out


def test_replay_with_a_step_batch_size_schedule(world, capsys):
    """Token thresholds become samples by the run's sequence length (32): 4K tokens is sample
    125, so iterations 1-8 take 16 (to 128) and the 9th on take 32: the 10th starts at 160."""
    root, prefixes, _ = world
    args = ["megatron", "replay", *_args(root, prefixes), "--step-batch-size-schedule"]
    rc, out, err = cli(capsys, *args, "0:16 4K:32", "--iteration", "10", "--json")
    assert rc == 0, err
    data = json.loads(out)
    assert (data["consumed"], data["global_batch"]) == (160, 32)
    rc, out, err = cli(capsys, *args, "0:16 4K:32", "--global-batch", "32", "--iteration", "1")
    _one_line_error(rc, out, err, r"drop --global-batch")


def test_show_text_decodes_each_sample_marking_document_ends(tmp_path, capsys, world):
    """Byte-level data (ids 0-255, EOD 256) cached by megatron-core, decoded with the bytes
    tokenizer: each sample's text is its L + 1 tokens as megatron-core returns them (tokens,
    then the last label), cut at every EOD id and joined with the marker."""
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    rng = np.random.default_rng(3)
    prefix = tmp_path / "prose"
    builder = indexed.IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    for _ in range(60):
        text = " ".join(rng.choice(words, int(rng.integers(1, 12)))).encode()
        doc = np.append(np.frombuffer(text, dtype=np.uint8).astype(np.int64), 256)
        builder.add_document(torch.from_numpy(doc), [len(doc)])
    builder.finalize(f"{prefix}.idx")
    peer = _build([prefix], None, [40, 0, 0], tmp_path / "cache", split="100,0,0")[0]
    args = [str(tmp_path / "cache"), "--prefix", str(prefix), "--iteration", "2"]
    rc, out, err = cli(
        capsys, "megatron", "replay", *args, "--global-batch", "8", "--tokenizer", "bytes",
        "--show-text", "--json",
    )  # fmt: skip
    assert rc == 0, err
    for s in json.loads(out)["samples"]:
        item = peer[s["sample"]]
        ids = [*item["tokens"].tolist(), int(item["labels"][-1])]
        parts, current = [], []
        for i in ids:
            if i == 256:
                parts.append(bytes(current).decode() + EOD_MARK)
                current = []
            else:
                current.append(i)
        assert s["text"] == "".join(parts) + bytes(current).decode()
    rc, out, err = cli(capsys, "megatron", "replay", *args, "--global-batch", "8", "--show-text")
    _one_line_error(rc, out, err, r"--show-text needs --tokenizer")


def test_the_documents_of_an_iteration_are_counted_from_its_samples(world):
    """Each document's samples and tokens, from megatron-core's own document ids per sample
    (a document read twice by one sample is one sample)."""
    root, prefixes, blend = world
    run = open_run(_query(root / "cache", prefixes))
    it = replay_iteration(run, 3, 64, 32, Shape())
    expected: dict[tuple[int, int], set[int]] = defaultdict(set)
    for g in range(64, 96):
        d, j = int(blend[0].dataset_index[g]), int(blend[0].dataset_sample_index[g])
        for doc in blend[0].datasets[d]._query_document_sample_shuffle_indices(j)[1].tolist():
            expected[(d, doc)].add(g)
    docs = it.documents()
    assert {(h.dataset, h.doc): h.samples for h in docs} == {k: len(v) for k, v in expected.items()}
    assert sum(h.tokens for h in docs) == 32 * (SEQ_LEN + 1)
    assert [h.samples for h in docs] == sorted((h.samples for h in docs), reverse=True)
