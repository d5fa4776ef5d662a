"""Which samples a Megatron-LM iteration trained on.

Iteration ``N`` (as its log counts them, from 1) trains on the global samples ``[C, C + B)``,
where ``C`` is the samples consumed by iterations ``1 .. N - 1`` and ``B`` the running global
batch size at ``C``. Within it, micro-batch ``m`` of data-parallel rank ``r`` holds samples
``C + m * mbs * dp + r * mbs + [0, mbs)`` (megatron-core's ``MegatronPretrainingSampler``).

The running global batch size at ``C`` (megatron-core's num-microbatches calculators):

- constant: ``--global-batch-size``;
- ``--rampup-batch-size START INCREMENT SAMPLES``: ``START + INCREMENT * int(C / (SAMPLES /
  n))`` while ``C <= SAMPLES`` (``n = (B - START) / INCREMENT`` increments), then ``B``;
- ``--decrease-batch-size-if-needed``: that, rounded down to a multiple of ``mbs * dp``;
- Megatron-LM's ``--step-batch-size-schedule "T0:B0 T1:B1 ..."``: the batch of the last
  threshold (tokens // sequence length, in samples) at or below ``C``.

Iterations skipped with ``--iterations-to-skip`` still consume their samples, so they change
nothing here. A run's log gives ``C`` directly: each logged line has the samples consumed after
its iteration (plus, where the log counts them apart, the ``skipped samples``) and the global
batch size.
"""

from __future__ import annotations

import io
import re
from bisect import bisect_right
from dataclasses import dataclass
from itertools import pairwise

from tokentape._src.util.files import open_regular
from tokentape._src.util.text import fmt_int
from tokentape.errors import ArgumentError, InputError


@dataclass(frozen=True)
class Rampup:
    start: int
    increment: int
    samples: int


SUFFIXES = {"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}
STEP_ENTRY = re.compile(r"([0-9]+(?:\.[0-9]*)?)([KMBT]?)", re.IGNORECASE)


def _step_number(text: str, entry: str) -> int:
    match = STEP_ENTRY.fullmatch(text.strip())
    if match is None or len(text) > 30:
        raise ArgumentError(
            f"--step-batch-size-schedule: {entry!r}: expected THRESHOLD:BATCH, numbers with an "
            "optional K, M, B or T"
        )
    return int(float(match.group(1)) * SUFFIXES.get(match.group(2).upper(), 1))


def parse_steps(text: str, seq_len: int | None) -> tuple[tuple[int, int], ...]:
    """Megatron-LM's ``--step-batch-size-schedule "0:768 250B:1536 ..."``: (threshold in
    samples, global batch) pairs, ascending. Thresholds are tokens when ``seq_len`` is given
    (Megatron-LM passes ``--seq-length``: ``tokens // seq_len`` samples), else samples."""
    steps = []
    for entry in text.replace(",", " ").split():
        threshold, colon, batch = entry.partition(":")
        if not colon:
            raise ArgumentError(f"--step-batch-size-schedule: {entry!r}: expected THRESHOLD:BATCH")
        at, size = _step_number(threshold, entry), _step_number(batch, entry)
        steps.append((at // seq_len if seq_len else at, size))
    steps.sort()
    if not steps or steps[0][0] != 0:
        raise ArgumentError("--step-batch-size-schedule: the first threshold must be 0")
    if any(a == b for (a, _), (b, _) in pairwise(steps)) or any(b < 1 for _, b in steps):
        raise ArgumentError(
            "--step-batch-size-schedule: thresholds must differ and batch sizes be positive"
        )
    return tuple(steps)


@dataclass(frozen=True)
class BatchSchedule:
    """The global batch size over the run, as megatron-core computes it (``steps``: Megatron-LM's
    ``--step-batch-size-schedule``, which then sets the batch; ``global_batch`` is ignored)."""

    global_batch: int
    rampup: Rampup | None = None
    decrease_if_needed: bool = False
    micro_batch: int | None = None
    dp: int | None = None
    steps: tuple[tuple[int, int], ...] | None = None

    def __post_init__(self) -> None:
        if self.steps is not None:
            if self.rampup is not None or self.decrease_if_needed:
                raise ArgumentError(
                    "--step-batch-size-schedule goes with neither --rampup nor "
                    "--decrease-batch-size-if-needed (as in Megatron-LM)"
                )
            return
        if self.global_batch < 1:
            raise ArgumentError("--global-batch: expected a positive batch size")
        r = self.rampup
        if r is not None:
            if r.start < 1 or r.increment < 1 or r.samples < 1:
                raise ArgumentError("--rampup: expected START >= 1, INCREMENT >= 1, SAMPLES >= 1")
            diff = self.global_batch - r.start
            if diff <= 0 or diff % r.increment:
                raise ArgumentError(
                    f"--rampup: the global batch {self.global_batch} minus the start {r.start} "
                    f"is not a positive multiple of the increment {r.increment}"
                )
        if self.decrease_if_needed and self.unit() is None:
            raise ArgumentError("--decrease-batch-size-if-needed needs --micro-batch and --dp")

    def unit(self) -> int | None:
        if self.micro_batch is None or self.dp is None:
            return None
        return self.micro_batch * self.dp

    def batch_at(self, consumed: int) -> int:
        """The running global batch size of the iteration starting at ``consumed`` samples."""
        if self.steps is not None:
            return self.steps[bisect_right([t for t, _ in self.steps], consumed) - 1][1]
        size = self.global_batch
        r = self.rampup
        if r is not None and consumed <= r.samples:
            per_increment = r.samples / ((self.global_batch - r.start) // r.increment)
            size = r.start + int(consumed / per_increment) * r.increment
        unit = self.unit()
        if self.decrease_if_needed and unit is not None:
            size = (size // unit) * unit
        if size < 1:
            raise ArgumentError(
                f"the running global batch size at {fmt_int(consumed)} samples is {size}: "
                "--micro-batch x --dp is larger than the batch"
            )
        return size

    def segments(self) -> tuple[list[int], list[int], list[int]]:
        """Where the batch size changes: first iteration, samples consumed before it, size."""
        iterations, consumed, sizes = [1], [0], [self.batch_at(0)]
        if self.steps is not None:
            for threshold, _ in self.steps[1:]:
                c, b = consumed[-1], sizes[-1]
                if threshold <= c:
                    continue
                k = -(-(threshold - c) // b)  # the first iteration starting at >= threshold
                iterations.append(iterations[-1] + k)
                consumed.append(c + k * b)
                sizes.append(self.batch_at(consumed[-1]))
            return iterations, consumed, sizes
        if self.rampup is None:
            return iterations, consumed, sizes
        limit = self.rampup.samples
        while consumed[-1] <= limit:
            c, b = consumed[-1], sizes[-1]
            # the first k with batch_at(c + k * b) != b (monotone in k), by bisection
            low, high = 1, (limit - c) // b + 2
            while low < high:
                mid = (low + high) // 2
                if self.batch_at(c + mid * b) != b:
                    high = mid
                else:
                    low = mid + 1
            iterations.append(iterations[-1] + low)
            consumed.append(c + low * b)
            sizes.append(self.batch_at(consumed[-1]))
        return iterations, consumed, sizes

    def consumed_before(self, iteration: int) -> tuple[int, int]:
        """(samples consumed before ``iteration``, its global batch size)."""
        if iteration < 1:
            raise ArgumentError(f"--iteration {iteration}: iterations count from 1, as logged")
        its, consumed, sizes = self.segments()
        k = bisect_right(its, iteration) - 1
        return consumed[k] + (iteration - its[k]) * sizes[k], sizes[k]

    def iteration_of(self, sample: int) -> tuple[int, int, int]:
        """(iteration, samples consumed before it, its batch size) of global ``sample``."""
        its, consumed, sizes = self.segments()
        k = bisect_right(consumed, sample) - 1
        n = (sample - consumed[k]) // sizes[k]
        return its[k] + n, consumed[k] + n * sizes[k], sizes[k]


LOG_LINE = re.compile(r"\biteration\s+([0-9]{1,18})\s*/\s*[0-9]+\s*\|")
CONSUMED = re.compile(r"\bconsumed samples:\s*([0-9]{1,18})\b")
BATCH = re.compile(r"\bglobal batch size:\s*([0-9]{1,18})\b")
SKIPPED = re.compile(r"\bskipped samples:\s*([0-9]{1,18})\b")


@dataclass(frozen=True)
class LoggedSchedule:
    """Iterations and samples as a run's log printed them (the last line of each iteration
    wins: a run resumed from a checkpoint logs its redone iterations again)."""

    path: str
    iterations: list[int]  # ascending
    consumed_after: list[int]
    batches: list[int | None]

    def consumed_before(self, iteration: int) -> tuple[int, int]:
        """(samples consumed before ``iteration``, its global batch size)."""
        if iteration < 1:
            raise ArgumentError(f"--iteration {iteration}: iterations count from 1, as logged")
        k = bisect_right(self.iterations, iteration) - 1
        if k >= 0 and self.iterations[k] == iteration and self.batches[k] is not None:
            size = self.batches[k]
            assert size is not None
            return self.consumed_after[k] - size, size
        if k + 1 < len(self.iterations):
            later, after = self.iterations[k + 1], self.consumed_after[k + 1]
            size = self.batches[k + 1]
            before_it, before = (0, 0) if k < 0 else (self.iterations[k], self.consumed_after[k])
            span = later - before_it
            if size is not None and after - before == span * size:
                return before + (iteration - 1 - before_it) * size, size
        raise InputError(
            f"{self.path}: iteration {iteration} is not logged, and the batch size around it "
            "is not constant between the lines that are: give --consumed"
        )

    def covers(self, sample: int) -> bool:
        """Whether the log reaches ``sample`` (it was consumed by a logged iteration or one
        before it)."""
        return sample < self.consumed_after[-1]

    def iteration_of(self, sample: int) -> tuple[int, int, int]:
        """(iteration, samples consumed before it, its batch size) of global ``sample``."""
        k = bisect_right(self.consumed_after, sample)
        if k == len(self.iterations):
            raise InputError(
                f"{self.path}: sample {fmt_int(sample)} is past the log's last line (iteration "
                f"{self.iterations[-1]}, {fmt_int(self.consumed_after[-1])} samples consumed)"
            )
        size, after, it = self.batches[k], self.consumed_after[k], self.iterations[k]
        before_it, before = (
            (0, 0) if k == 0 else (self.iterations[k - 1], self.consumed_after[k - 1])
        )
        if size is not None and after - before == (it - before_it) * size:
            n = (sample - before) // size
            return before_it + 1 + n, before + n * size, size
        if size is not None and after - size <= sample:
            return it, after - size, size
        raise InputError(
            f"{self.path}: the batch size between iterations {before_it} and {it} is not "
            f"constant: sample {fmt_int(sample)}'s iteration is not known from the log"
        )


def read_megatron_log(path: str) -> LoggedSchedule:
    """The iterations, samples consumed and batch sizes of a Megatron-LM training log."""
    seen: dict[int, tuple[int, int | None, int]] = {}
    try:
        with io.TextIOWrapper(open_regular(path), encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                it, consumed = LOG_LINE.search(line), CONSUMED.search(line)
                if it is None or consumed is None:
                    continue
                batch, skipped = BATCH.search(line), SKIPPED.search(line)
                after = int(consumed.group(1)) + (int(skipped.group(1)) if skipped else 0)
                size = int(batch.group(1)) if batch else None
                if int(it.group(1)) < 1 or size == 0 or (size is not None and after < size):
                    raise InputError(
                        f"{path}, line {number}: iteration {it.group(1)} with {after} samples "
                        f"consumed and a global batch of {size}: not a training log's line"
                    )
                seen[int(it.group(1))] = (after, size, number)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file (a Megatron-LM training log)") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    if not seen:
        raise InputError(
            f"{path}: no line 'iteration N/ M | consumed samples: C |': not a Megatron-LM "
            "training log (it needs log lines with the consumed samples)"
        )
    order = sorted(seen)
    for before, later in pairwise(order):
        if seen[later][0] <= seen[before][0]:
            raise InputError(
                f"{path}, line {seen[later][2]}: iteration {later} has consumed "
                f"{seen[later][0]} samples, no more than iteration {before} (line "
                f"{seen[before][2]}): the lines disagree"
            )
    return LoggedSchedule(path, order, [seen[i][0] for i in order], [seen[i][1] for i in order])
