"""Locate: the closed-form inverse query against a brute-force scan of the tape.

Expectations are derived independently: the forward map (``Tape.resolve`` of every position),
``Source.docs_in`` of each sample, and steps/ranks by walking ``positions_for`` over the run's
batch shapes. ``locate`` itself uses the inverse (``position_of``) and ``Schedule.place``.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokentape._src.audit.locate import Located, locate
from tokentape._src.audit.runs import log_schedule
from tokentape._src.plan.load import load_plan
from tokentape._src.plan.plan import Plan, resolve_plan
from tokentape._src.plan.spec import parse_plan
from tokentape._src.program import main
from tokentape._src.store.reader import Source
from tokentape._src.tape.excise import samples_overlapping
from tokentape._src.tokenize.driver import tokenize
from tokentape._src.tokenize.job import TokenizeConfig
from tokentape._src.train import steplog
from tokentape._src.train.loader import Loader
from tokentape._src.train.partition import BatchConfig, positions_for
from tokentape._src.train.schedule import Schedule
from tokentape.errors import TokentapeError

L = 16
DOCS = {"web": 60, "code": 30, "math": 8}
TAIL = 10  # web's last (n_tokens - 1) % L tokens lie past the last window: a tail document
PLAN_TOML = """\
seq_len = 16
seed = {seed}
total_samples = {horizon}
weight_denominator = 1000
[[source]]
name = "web"
path = "stores/web"
weight = 5
max_repeats = 100
[[source]]
name = "code"
path = "stores/code"
weight = 3
max_repeats = 100
[[source]]
name = "math"
path = "stores/math"
weight = 2
max_repeats = 100
"""
HORIZON = 1200

Row = tuple[int, int, int]  # (position, epoch, sample)
Where = tuple[int, int, int]  # (step, dp rank, micro-step)


def doc_texts(name: str, n: int, seed: int) -> list[str]:
    """Short docs (several per window), long ones (spanning several windows), and for web a
    tiny last document placed after the last full window."""
    rng = np.random.default_rng(seed)
    lengths = [
        int(rng.choice([rng.integers(1, 8), rng.integers(8, 40), rng.integers(40, 90)]))
        for _ in range(n)
    ]
    if name == "web":  # bytes tokenizer: a document of c ASCII chars is c + 1 tokens
        lengths[-1] = 2
        n_tokens = sum(c + 1 for c in lengths)
        lengths[-2] += (TAIL - (n_tokens - 1) % L) % L
    return [name[0] * c for c in lengths]


def make_store(root: Path, name: str, n: int, seed: int) -> Path:
    data = root / f"{name}.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in doc_texts(name, n, seed)))
    out = root / "stores" / name
    tokenize(TokenizeConfig(inputs=(str(data),), out=str(out), shard_mb=0.001))
    return out


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("locate")
    for i, (name, n) in enumerate(DOCS.items()):
        make_store(path, name, n, seed=i)
    (path / "mix.toml").write_text(PLAN_TOML.format(seed=7, horizon=HORIZON))
    return path


def plan_with(root: Path, seed: int = 7, horizon: int = HORIZON) -> Plan:
    text = PLAN_TOML.format(seed=seed, horizon=horizon)
    return resolve_plan(parse_plan(text, "mix.toml", str(root)), "mix.toml")


@pytest.fixture(scope="module")
def plan(root: Path) -> Plan:
    return plan_with(root)


@pytest.fixture(scope="module")
def stores(plan: Plan) -> list[Source]:
    return [Source(s.path) for s in plan.sources]


@pytest.fixture(scope="module")
def docs_of(plan: Plan, stores: list[Source]) -> list[list[list[int]]]:
    """docs_of[d][k]: the documents sample k of source d overlaps, by ``Source.docs_in``."""
    return [
        [s.docs_in(k, L) for k in range(p.n_samples)]
        for s, p in zip(stores, plan.sources, strict=True)
    ]


def brute_force(plan: Plan, docs_of: list[list[list[int]]], limit: int) -> dict[tuple, list[Row]]:
    """(source, doc) → every (position, epoch, sample) below ``limit`` that shows the doc."""
    r = plan.tape().resolve(np.arange(limit))
    found: dict[tuple, list[Row]] = defaultdict(list)
    for p, (d, e, k) in enumerate(
        zip(r.source.tolist(), r.epoch.tolist(), r.sample.tolist(), strict=True)
    ):
        for doc in docs_of[d][k]:
            found[(d, doc)].append((p, e, k))
    return found


def rows(found: Located) -> list[Row]:
    return list(
        zip(found.position.tolist(), found.epoch.tolist(), found.sample.tolist(), strict=True)
    )


def walk(runs: list[tuple[BatchConfig, int]]) -> tuple[dict[int, Where], int]:
    """Where each position of a run is read (by ``positions_for``), and the samples applied."""
    where: dict[int, Where] = {}
    consumed, step = 0, 0
    for config, steps in runs:
        for _ in range(steps):
            for rank in range(config.dp_size):
                block = positions_for(consumed, rank, config)
                for (m, _), p in np.ndenumerate(block):
                    where[int(p)] = (step, rank, m)
            consumed, step = consumed + config.global_batch, step + 1
    return where, consumed


def placed(found: Located) -> list[Where]:
    assert found.placement is not None
    p = found.placement
    return list(zip(p.step.tolist(), p.dp_rank.tolist(), p.micro_step.tolist(), strict=True))


# --- the closed form against the scan -------------------------------------------------------


def test_the_stores_exercise_the_edge_cases(plan: Plan, stores: list[Source]) -> None:
    assert all(len(s.manifest.shards) > 1 for s in stores[:2])  # windows cross shards
    assert all(s.n_docs == DOCS[p.name] for s, p in zip(stores, plan.sources, strict=True))
    assert [p.passes > 3 for p in plan.sources] == [True, True, True]
    spans = [
        samples_overlapping(s.doc_span(i), L, p.n_samples)
        for s, p in zip(stores, plan.sources, strict=True)
        for i in range(s.n_docs)
    ]
    assert max(len(r) for r in spans) >= 5 and min(len(r) for r in spans) == 0


def test_every_document_of_every_source_matches_the_scan(plan, stores, docs_of) -> None:
    expected = brute_force(plan, docs_of, HORIZON)
    total = 0
    for d, (spec, store) in enumerate(zip(plan.sources, stores, strict=True)):
        for doc in range(store.n_docs):
            found = locate(plan, spec.name, doc, store=store)
            assert rows(found) == expected.get((d, doc), []), (spec.name, doc)
            assert found.placement is None and found.limit == HORIZON
            total += len(found.position)
    assert total == sum(len(v) for v in expected.values())


def test_a_sample_lists_a_document_iff_the_document_lists_the_sample(plan, stores) -> None:
    for spec, store in zip(plan.sources, stores, strict=True):
        listed = defaultdict(set)
        for doc in range(store.n_docs):
            for k in samples_overlapping(store.doc_span(doc), L, spec.n_samples):
                listed[k].add(doc)
        for k in range(spec.n_samples):
            assert listed[k] == set(store.docs_in(k, L)), (spec.name, k)


@settings(max_examples=300)
@given(
    start=st.integers(0, 200),
    length=st.integers(1, 60),
    seq_len=st.integers(1, 20),
    n=st.integers(1, 30),
)
def test_samples_overlapping_is_window_intersection(start, length, seq_len, n) -> None:
    doc = set(range(start, start + length))
    expected = [k for k in range(n) if doc & set(range(k * seq_len, k * seq_len + seq_len + 1))]
    assert list(samples_overlapping((start, start + length), seq_len, n)) == expected


@settings(max_examples=25)
@given(seed=st.integers(0, 2**63 - 1), data=st.data())
def test_random_seeds_and_documents_match_the_scan(root, docs_of, stores, seed, data) -> None:
    horizon = data.draw(st.integers(1, 2000), label="horizon")
    plan = plan_with(root, seed, horizon)
    d = data.draw(st.integers(0, 2), label="source")
    doc = data.draw(st.integers(0, stores[d].n_docs - 1), label="doc")
    expected = brute_force(plan, docs_of, horizon).get((d, doc), [])
    assert rows(locate(plan, plan.sources[d].name, doc, store=stores[d])) == expected


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**63 - 1), data=st.data())
def test_plans_in_phases_match_the_scan(root, docs_of, stores, seed, data) -> None:
    """Locate across phases (weights of 0 included, boundaries anywhere) = the brute force."""
    horizon = data.draw(st.integers(50, 1500), label="horizon")
    weights = st.lists(st.integers(0, 4), min_size=3, max_size=3).filter(any)
    starts = sorted(set(data.draw(st.lists(st.integers(1, horizon - 1), min_size=1, max_size=3))))
    text = PLAN_TOML.format(seed=seed, horizon=horizon).replace("weight_denominator = 1000\n", "")
    for start in starts:
        w = data.draw(weights, label=f"phase at {start}")
        table = ", ".join(f"{n} = {x}" for n, x in zip(DOCS, w, strict=True))
        text += f"[[phase]]\nstart_samples = {start}\nweights = {{ {table} }}\n"
    plan = resolve_plan(parse_plan(text, "mix.toml", str(root)), "mix.toml")
    d = data.draw(st.integers(0, 2), label="source")
    doc = data.draw(st.integers(0, stores[d].n_docs - 1), label="doc")
    expected = brute_force(plan, docs_of, horizon).get((d, doc), [])
    assert rows(locate(plan, plan.sources[d].name, doc, store=stores[d])) == expected


# --- steps and ranks ------------------------------------------------------------------------


def test_uniform_schedule_places_every_position_like_the_partition(plan, stores) -> None:
    config = BatchConfig(dp_size=3, micro=2, accum=2)
    where, _ = walk([(config, -(-HORIZON // config.global_batch))])
    schedule = Schedule.uniform(config)
    for spec, store in zip(plan.sources, stores, strict=True):
        for doc in range(store.n_docs):
            found = locate(plan, spec.name, doc, schedule, store=store)
            assert placed(found) == [where[p] for p in found.position.tolist()]
            assert found.trained.all()


def test_until_step_on_a_uniform_schedule_may_pass_the_horizon(plan, stores, docs_of) -> None:
    config = BatchConfig(dp_size=2, micro=4, accum=3)  # 24 per step
    for until in (0, 7, 70):  # step 70 ends at 1704, past the horizon
        end = (until + 1) * 24
        expected = brute_force(plan, docs_of, end)
        for doc in (0, 5, 7):
            found = locate(plan, "math", doc, Schedule.uniform(config), until, store=stores[2])
            assert rows(found) == expected.get((2, doc), [])
            assert found.limit == end and found.seen == bool(expected.get((2, doc)))
            assert all(step <= until for step, _, _ in placed(found))


RUNS = [(BatchConfig(2, 3, 2), 10), (BatchConfig(4, 1, 2), 15), (BatchConfig(1, 5, 1), 4)]


@pytest.fixture(scope="module")
def step_log(root: Path, plan: Plan) -> Path:
    """A real step log: the loader of rank 0 committing steps, the batch shape changing twice."""
    path = root / "steps.jsonl"
    with Loader(plan, 0, RUNS[0][0], prefetch=0, step_log=path) as loader:
        for config, steps in RUNS:
            loader.set_config(config)
            for _ in range(steps):
                loader.step()
                loader.commit()
    return path


def test_log_schedule_with_batch_changes(plan, stores, step_log) -> None:
    where, end = walk(RUNS)
    schedule = log_schedule(str(step_log), plan)
    assert schedule.steps == 29 and schedule.end == end < HORIZON
    untrained = 0
    for spec, store in zip(plan.sources, stores, strict=True):
        for doc in range(store.n_docs):
            found = locate(plan, spec.name, doc, schedule, store=store)
            positions = found.position.tolist()
            assert found.limit == HORIZON  # the log ends before the horizon
            assert found.trained.tolist() == [p < end for p in positions]
            assert placed(found) == [where.get(p, (-1, -1, -1)) for p in positions]
            untrained += int((~found.trained).sum())
    assert untrained > 0


@pytest.mark.parametrize("until", [0, 9, 10, 17, 28])
def test_until_step_on_a_log(plan, stores, docs_of, step_log, until) -> None:
    where, _ = walk(RUNS)
    end = 1 + max(p for p, (s, _, _) in where.items() if s == until)
    expected = brute_force(plan, docs_of, end)
    schedule = log_schedule(str(step_log), plan)
    seen = 0
    for d, (spec, store) in enumerate(zip(plan.sources, stores, strict=True)):
        for doc in range(store.n_docs):
            found = locate(plan, spec.name, doc, schedule, until, store=store)
            assert rows(found) == expected.get((d, doc), [])
            assert found.seen == bool(expected.get((d, doc))) and found.trained.all()
            assert placed(found) == [where[p] for p in found.position.tolist()]
            seen += found.seen
    assert seen > 0


PAST = BatchConfig(2, 50, 1)  # 30 steps of 100 samples: the run goes to 3,000
PAST_HORIZON = 600


def write_log(path: Path, plan: Plan, runs: list[tuple[BatchConfig, int]]) -> Path:
    """A step log of ``runs``, written line by line as the loader writes it."""
    lines, consumed, step = [], 0, 0
    for config, steps in runs:
        for _ in range(steps):
            rec = {
                "step": step,
                "consumed": consumed,
                "global_batch": config.global_batch,
                "dp": config.dp_size,
                "micro": config.micro,
                "accum": config.accum,
                "index_hash": plan.index_hash,
                "tokens_hash": f"t{step}",
                "time": 1.0,
            }
            lines.append(json.dumps(rec, sort_keys=True) + "\n")
            consumed, step = consumed + config.global_batch, step + 1
    path.write_text("".join(lines))
    return path


def test_a_log_past_the_horizon_is_searched_to_its_end(root, stores, docs_of) -> None:
    """Horizon 600, a logged run to position 3,000: every window drawn before 3,000 is found
    (and trained), not only those before the horizon."""
    plan = plan_with(root, horizon=PAST_HORIZON)
    log = write_log(root / "past.jsonl", plan, [(PAST, 30)])
    schedule = log_schedule(str(log), plan)
    end = 30 * PAST.global_batch
    expected = brute_force(plan, docs_of, end)
    where, _ = walk([(PAST, 30)])
    past = 0
    for d, (spec, store) in enumerate(zip(plan.sources, stores, strict=True)):
        for doc in range(store.n_docs):
            found = locate(plan, spec.name, doc, schedule, store=store)
            assert rows(found) == expected.get((d, doc), []), (spec.name, doc)
            assert found.limit == end and found.trained.all()
            assert placed(found) == [where[p] for p in found.position.tolist()]
            past += int((found.position >= PAST_HORIZON).sum())
    assert past > 0
    # Without the log (or with an open-ended schedule) the horizon is the limit, as before.
    assert locate(plan, "web", 0, Schedule.uniform(PAST), store=stores[0]).limit == PAST_HORIZON


def test_cli_with_a_log_past_the_horizon(capsys, root, docs_of) -> None:
    plan = plan_with(root, horizon=PAST_HORIZON)
    plan_path = root / "past.json"
    plan_path.write_text(plan.to_json())
    log = write_log(root / "past.jsonl", plan, [(PAST, 30)])
    end = 30 * PAST.global_batch
    expected = brute_force(plan, docs_of, end)[(1, 4)]
    rc, out, _ = run_cli(capsys, str(plan_path), f"code 4 --log {log} --json")
    got = json.loads(out)
    assert rc == 0 and got["limit"] == end and got["horizon"] == PAST_HORIZON
    assert [(r["position"], r["epoch"], r["sample"]) for r in got["rows"]] == expected
    assert all(r["step"] == r["position"] // 100 for r in got["rows"])
    assert max(r["position"] for r in got["rows"]) >= PAST_HORIZON
    rc, out, _ = run_cli(capsys, str(plan_path), f"code 4 --log {log}")
    assert rc == 0 and re.search(
        r"searched +positions 0\.\.2,999 \(to the end of the step log", out
    )


def test_the_cli_parses_the_log_once(capsys, monkeypatch, plan_json, step_log) -> None:
    parsed = count_log_parses(monkeypatch)
    rc, _, _ = run_cli(capsys, plan_json, f"web 3 --log {step_log}")
    assert rc == 0 and parsed == [len(step_log.read_text().splitlines())]


def count_log_parses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the step log's parses of its lines (``steplog.loads_line``), in a one-item
    list."""
    loads, count = steplog.loads_line, [0]

    def counting(s):
        if "tokens_hash" in s:
            count[0] += 1
        return loads(s)

    monkeypatch.setattr(steplog, "loads_line", counting)
    return count


def test_a_store_other_than_the_planned_one_is_refused(plan, stores) -> None:
    with pytest.raises(TokentapeError, match=r"\(source 'web'\) changed since the plan was made"):
        locate(plan, "web", 0, store=stores[1])


def test_until_step_beyond_the_log_is_refused(plan, step_log) -> None:
    schedule = log_schedule(str(step_log), plan)
    with pytest.raises(TokentapeError, match="ends at step 28"):
        locate(plan, "web", 0, schedule, until_step=29)


# --- the command ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plan_json(root: Path) -> str:
    out = root / "mix.json"
    assert main(["plan", str(root / "mix.toml"), "--out", str(out)]) == 0
    return str(out)


def run_cli(capsys: pytest.CaptureFixture[str], plan: str, args: str) -> tuple[int, str, str]:
    """``tokentape locate PLAN ARGS...`` (ARGS split on spaces): exit code, stdout, stderr."""
    capsys.readouterr()
    rc = main(["locate", plan, *args.split()])
    out, err = capsys.readouterr()
    return rc, out, err


def test_json_has_every_row_with_steps_and_ranks(capsys, plan_json) -> None:
    rc, out, _ = run_cli(capsys, plan_json, "web 3 --dp 3 --micro 2 --accum 2 --json --limit 1")
    assert rc == 0
    got = json.loads(out)
    found = locate(load_plan(plan_json), "web", 3, Schedule.uniform(BatchConfig(3, 2, 2)))
    assert got["count"] == len(got["rows"]) == found.position.size > 1
    keys = ("position", "epoch", "sample", "step", "dp_rank", "micro_step")
    assert [tuple(r[k] for k in keys) for r in got["rows"]] == [
        (*row, *w) for row, w in zip(rows(found), placed(found), strict=True)
    ]
    assert got["first_step"] == got["rows"][0]["step"] == found.position[0] // 12
    assert got["last_step"] == found.position[-1] // 12
    assert (got["source"], got["doc"], got["span"]) == ("web", 3, list(found.span))


def test_json_with_global_batch_has_steps_only(capsys, plan_json) -> None:
    rc, out, _ = run_cli(capsys, plan_json, "code 4 --global-batch 10 --json")
    got = json.loads(out)
    assert rc == 0 and got["rows"]
    for r in got["rows"]:
        assert "dp_rank" not in r and r["step"] == r["position"] // 10


def test_json_with_a_log_marks_untrained_positions(capsys, plan_json, step_log) -> None:
    _, end = walk(RUNS)
    rc, out, _ = run_cli(capsys, plan_json, f"math 2 --log {step_log} --json")
    got = json.loads(out)
    assert rc == 0 and got["seen"] is None
    trained = [r for r in got["rows"] if r["position"] < end]
    later = [r for r in got["rows"] if r["position"] >= end]
    assert trained and later and got["trained"] == len(trained)
    assert all(r["step"] is not None and r["dp_rank"] is not None for r in trained)
    assert all(r["step"] is None and r["dp_rank"] is None for r in later)


def table_rows(out: str) -> list[list[str]]:
    lines = out.splitlines()
    rule = next(i for i, line in enumerate(lines) if line.strip().startswith("---"))
    body = [line for line in lines[rule + 1 :] if not line.strip().startswith("...")]
    return [line.split() for line in body]


def test_table_with_limit(capsys, plan_json) -> None:
    found = locate(load_plan(plan_json), "math", 1, Schedule.uniform(BatchConfig(2, 2, 1)))
    n = found.position.size
    expected = [[p, *w, e, k] for (p, e, k), w in zip(rows(found), placed(found), strict=True)]
    assert n > 3
    rc, out, _ = run_cli(capsys, plan_json, "math 1 --dp 2 --micro 2 --limit 3")
    assert rc == 0
    assert re.search(r"document +1 of source 'math'", out)
    assert re.search(rf"positions +{n} in \d+ passes", out)
    assert re.search(rf"first step +{expected[0][1]}\n", out)
    assert re.search(rf"last step +{expected[-1][1]}\n", out)
    assert f"... {n - 3} more" in out
    header = out.splitlines()[out.splitlines().index("") + 1].split()
    assert header == ["position", "step", "dp", "rank", "micro", "epoch", "sample"]
    assert [[int(c.replace(",", "")) for c in r] for r in table_rows(out)] == expected[:3]


def test_table_with_a_log_shows_untrained_positions(capsys, plan_json, step_log) -> None:
    plan = load_plan(plan_json)
    found = locate(plan, "math", 2, log_schedule(str(step_log), plan))
    rc, out, _ = run_cli(capsys, plan_json, f"math 2 --log {step_log} --limit 1000")
    untrained = int((~found.trained).sum())
    assert rc == 0 and untrained > 0
    assert re.search(rf"trained so far +{found.position.size - untrained} of ", out)
    assert [r[1:4] for r in table_rows(out)].count(["not", "yet", "trained"]) == untrained


def test_table_with_until_step_says_whether_seen(capsys, plan_json, step_log) -> None:
    plan = load_plan(plan_json)
    schedule = log_schedule(str(step_log), plan)
    answers = set()
    for until in (0, 28):
        for doc in range(DOCS["math"]):
            found = locate(plan, "math", doc, schedule, until)
            rc, out, _ = run_cli(
                capsys, plan_json, f"math {doc} --log {step_log} --until-step {until}"
            )
            answer = "yes" if found.seen else "no"
            assert rc == 0 and re.search(rf"seen by step {until} +{answer}\n", out)
            if found.seen:
                assert [int(r[0]) for r in table_rows(out)] == found.position.tolist()
            else:
                assert "(no positions)" in out
            answers.add(answer)
    assert answers == {"yes", "no"}


def test_table_without_a_schedule_and_a_tail_document(capsys, plan_json) -> None:
    rc, out, _ = run_cli(capsys, plan_json, f"web {DOCS['web'] - 1}")
    assert rc == 0 and "past the last full window" in out and "(no positions)" in out
    rc, out, _ = run_cli(capsys, plan_json, "web 0 --limit 0")
    assert rc == 0 and "---" not in out and re.search(r"\.\.\. \d+ more", out)


def bad_log(root: Path, step_log: Path) -> str:
    path = root / "other.jsonl"
    lines = step_log.read_text().splitlines()
    other = [json.dumps(json.loads(x) | {"index_hash": "sha256:" + "0" * 64}) for x in lines]
    path.write_text("\n".join(other) + "\n")
    return str(path)


ERRORS = [
    ("nope 0", "unknown source 'nope'; the plan has: web, code, math"),
    ("web 60", "document 60 out of range; it has documents 0..59"),
    ("web -1", "document -1 out of range; it has documents 0..59"),
    ("web 0 --dp 2", "--dp and --micro go together"),
    ("web 0 --micro 2", "--dp and --micro go together"),
    ("web 0 --accum 2", "--dp and --micro go together"),
    ("web 0 --global-batch 8 --dp 2 --micro 2", "give one of"),
    ("web 0 --global-batch 8 --log x.jsonl", "give one of"),
    ("web 0 --global-batch 0", "--global-batch must be a positive integer"),
    ("web 0 --dp 2 --micro -3", "--micro must be a positive integer"),
    ("web 0 --until-step 3", "--until-step needs the batch configuration"),
    ("web 0 --global-batch 8 --until-step -1", "expected a step >= 0"),
    ("web 0 --limit -1", "--limit must be >= 0"),
    ("web 0 --log {log} --until-step 29", "beyond the step log, which ends at step 28"),
    ("web 0 --log {other}", "differs from the plan's"),
    ("web 0 --log {missing}", "cannot read the step log"),
]


@pytest.mark.parametrize(("args", "message"), ERRORS)
def test_errors_are_one_line_exit_2(capsys, root, plan_json, step_log, args, message) -> None:
    paths = {"log": step_log, "other": bad_log(root, step_log), "missing": root / "no.jsonl"}
    rc, out, err = run_cli(capsys, plan_json, args.format(**paths))
    assert (rc, out) == (2, "")
    assert err.startswith("tokentape: error: ") and err.count("\n") == 1 and message in err


@pytest.mark.parametrize("content", [None, "not json", '{"format": "other"}'])
def test_missing_or_bad_plan_files(capsys, tmp_path, content) -> None:
    path = tmp_path / "plan.json"
    if content is not None:
        path.write_text(content)
    rc, out, err = run_cli(capsys, str(path), "web 0")
    assert (rc, out) == (2, "") and err.count("\n") == 1 and f"plan '{path}'" in err
