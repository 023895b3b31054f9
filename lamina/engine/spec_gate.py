"""SpecGate: speculation on or off, per batch size and sampling, by the throughput each delivers (issue #12: never
slower).

The policy (spec_policy.py) predicts what drafts buy from a model of a step's cost; what its verify steps, its
decisions and its steps not launched ahead really cost shows only in the engine's throughput, and the gate
measures that. Steps run in windows of `window` steps, each window in one arm:

    SPEC    the speculator decides and drafts as the policy says (its own pauses included)
    PLAIN   no decision, no drafts: the engine runs as without speculation, its steps launched ahead

A window's rate is the tokens its steps emitted over their wall time, counting only the steps whose drafts were
decided in the window's arm (not its first: those were decided before it began), that compiled no kernel and that
were no stall (more than STALL_FACTOR times the window's median step: a first use, a garbage collection; one such
step in a 16-step window would make its arm look several times slower, and the probes' EMA would carry it).
While no request waits to be admitted, the batch drains and ends with its slowest request: drafts that speed some
rows while the verify steps slow the others make more tokens a second and a later end, so a draining window's rate
is charged by its slowest row's tokens over its mean row's (`row_balance`; 1 for a plain window, whose rows each
emit a token a step). With requests waiting, a row that ends early is replaced: tokens a second are the measure.
Each bucket (the rows of a step by powers of two, and whether every row is greedy) has a leading arm, and the other
is probed for one window after `gap` windows of the leader. Greedy and sampled steps are measured apart: what
drafts buy differs between them by more than the arms' margins (acceptance; FULL looks ahead only while every row
is greedy, below). At batch 1 on a GPU n-gram's speed-up greedy and at T = 0.6 differ by a third or more, and so
does which mode leads (docs/BENCHMARKS.md, forty-second session); one bucket for both relearnt its leaders at every
change between them. The host's speed drifts by tens of percent
over seconds (seen on the H200's host), so a probe is judged against its neighbours: its rate over the geometric
mean rate of the leader's windows just before and just after it is one sample of speculation's advantage (log of
spec rate over plain rate; over their arithmetic mean the log was biased against the probed arm, by -0.07 at the
window-to-window spread of n-gram at batch 1), an EMA over probes decides the leader. A probe whose neighbours
differ by more than NEIGHBOURS_AGREE (the workload changed across it: a new prompt) judges nothing (the next probe
comes after the gap, as after any, so that probes cost no more where the workload changes often):

    window:   1  2  3  4  5  6  7  8  9 10 11 12 13 14 15 ...
    arm:      S  P  S  S  P  S  S  S  S  P  S  S  S  S  S ...   (the leader S, its probes losing narrowly)
                 ^ probe, judged against windows 1 and 3

Speculation leads while its advantage beats SPEC_MARGIN: in doubt, the engine runs as without it. A probe lasts
no longer than the leader's windows take (its WINDOW steps, or as many as fit in the time of one of the leader's,
MIN_PROBE_STEPS at least): where speculating steps cost several plain ones (a draft model's verify at 128 rows,
~5x), a probe of WINDOW of them would cost several windows' time. So a probe of the slower arm wastes at most
`loss` of one leader window, loss = 1 - slower rate / faster rate, and the next probe comes after max(2 gap, loss /
EXPLORE_BUDGET) leader windows (loss / EXPLORE_BUDGET after a change of lead or after a probe whose own sample found
the probed arm faster: the lead may be wrong; at least 1, at most `max_gap`): the probes of an arm 30 % slower
cost 1 % of the time, those of one 2 % slower come often, which they may (its noise takes more windows to settle,
and a wrong lead costs little). MAX_GAP bounds both ways: the probes of an arm far slower cost about 1 / MAX_GAP of
the time at most (more where MIN_PROBE_STEPS of its steps outlast a leader window), and a change of workload
(another prompt, longer contexts) is noticed within max_gap windows and followed a few windows later
(scripts/spec_gate_noise.py simulates both; docs/speculative.md). A window ends early when the batch leaves its
bucket; it counts if at least half of it was counted, else its arm runs again.

The speculating windows have two modes, chosen the same way by a second pair of arms per bucket
(SpecGate(full=True), the engine's):

    SPEC    the policy decides each step's drafts (above)
    FULL    no policy: every request that may draft gets up to k drafts, at every step (as `adaptive: false`;
            n-gram launches steps ahead while no match is in sight: speculator.py)

SPEC leads first and in doubt: FULL needs FULL_MARGIN (5 %) over it to lead where a bucket holds several rows,
SPEC_MARGIN (2 %) at one row (`full_margin`: one row's window rate is all its request's speed, no tail to charge).
The modes are compared only while speculation leads its bucket (after its first probe of plain): a probe of
speculation runs in the leading mode, so that where plain leads no window probes twice over (at 128 rows FULL ran at
a fraction of plain's rate, and its probes came inside speculation's). When plain takes the lead, the modes start over
with the policy leading (a FULL lead learnt on another workload would otherwise run every probe of speculation). A
speculating window counts for speculation's rate only in the mode that leads, so that a probe of the other mode is
not taken for it. Why FULL: the policy's bookkeeping and decisions cost host time every step, a tenth or so of a
batch-1 step on a GPU's host, where a verify step costs little more than a plain one, so drafting at every match
pays: k fixed ran faster than the policy at batch 1 (docs/BENCHMARKS.md, thirty-fifth session). At 128-256 rows
drafts without the policy lose and are only probed, if speculation leads there at all.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from lamina.engine.request import Request

WINDOW = 16  # steps a window (a batch-1 step of the demo model is ~0.3-0.5 ms on the H200, ~4 ms on the CPU)
MAX_GAP = 64  # windows of the leader between two probes, at most
RATE_DECAY = 0.7  # EMAs (the advantage, each arm's rate): this much of the old value, the rest the new sample
SPEC_MARGIN = 0.02  # speculation leads only while faster than plain by this much: in doubt, the plain engine
# drafting without the policy (FULL) leads the policy only while faster by this much where a bucket holds several
# rows: a fixed batch's requests that draft finish first and leave a tail of slower steps that a window's rate did
# not charge, and FULL drafts the most (at 128 rows it once led on a 3 % edge and lost to off: docs/speculative.md).
# Draining windows are charged for it since (row_balance); the margin stays, not measured without it. One row has
# no tail: there FULL needs SPEC_MARGIN only (full_margin)
FULL_MARGIN = 0.05
EXPLORE_BUDGET = 0.01  # probes of the slower arm cost at most this share of the throughput (up to MAX_GAP)
MIN_PROBE_STEPS = 4  # a probe cut short by the leader's window time runs this many steps at least (its first is
# not counted: its drafts were decided in the window before)
# a probe's two neighbours (the leader's windows before and after it) must be within this factor of each other to
# judge it. At batch 1 a new prompt changes the rate several times over (n-gram: 8 tokens a step at the end of one
# code prompt, 1 at the start of the next), and one probe across such a change made a sample of -1.1 that became the
# advantage and put the next probe 64 windows off (a CPU harness replaying the demo model's outputs, session 44)
NEIGHBOURS_AGREE = 2.0
STALL_FACTOR = 50  # a counted step slower than this many times its window's median step is left out of the rate


class Arm(Enum):
    SPEC = "spec"  # the policy decides the drafts
    FULL = "full"  # every request that may draft gets up to k (no policy)
    PLAIN = "plain"  # no drafts, no decisions


def full_margin(rows: int) -> float:
    """The edge FULL needs over the policy to lead in a bucket of `rows` rows: FULL_MARGIN, SPEC_MARGIN at one."""
    return SPEC_MARGIN if rows == 1 else FULL_MARGIN


def ema(old: float | None, sample: float) -> float:
    """An EMA's next value: RATE_DECAY of the old one (none: the sample itself), the rest the sample."""
    return sample if old is None else RATE_DECAY * old + (1 - RATE_DECAY) * sample


def batch_bucket(num_rows: int) -> int:
    """The power of two at or above `num_rows`: rows 1, 2, 3-4, 5-8, 9-16, ... share a bucket."""
    return 1 << max(0, num_rows - 1).bit_length()


class Bucket(NamedTuple):
    """Where a step's window is measured: its rows' batch_bucket, and whether every row is greedy (a tuple: the
    states are looked up every step)."""

    rows: int
    greedy: bool = False

    @property
    def label(self) -> str:
        """"ROWS greedy" or "ROWS sampled" (reports)."""
        return f"{self.rows} {'greedy' if self.greedy else 'sampled'}"


@dataclass
class BucketState:
    """One bucket's choice between two arms, `first` and `second` (speculation against plain, or
    drafts without the policy against the policy's): the paired advantage of `first`, the leader, the probe
    schedule, and each arm's rate (an EMA of its windows, tokens/s: for reading; decisions use the pairs)."""

    first: Arm = Arm.SPEC
    second: Arm = Arm.PLAIN  # leads in doubt: `first` must be faster by `margin`
    margin: float = SPEC_MARGIN
    advantage: float | None = None  # EMA of log(first rate / second rate) over probes, each against its neighbours
    leader: Arm | None = None  # None: `first`
    gap: int = 1  # leader windows between probes
    since_probe: int = 0  # leader windows since the last probe
    first_rate: float | None = None
    second_rate: float | None = None
    first_windows: int = 0  # windows measured in each arm
    second_windows: int = 0
    before: float | None = None  # the rate of the leader's last window
    lead_seconds: float | None = None  # EMA of the wall time of the leader's whole windows: a probe's longest
    probe: float | None = None  # the rate of a probe waiting for the leader window after it

    def __post_init__(self) -> None:
        self.leader = self.first if self.leader is None else self.leader

    def next_arm(self) -> Arm:
        probing = self.probe is None and self.before is not None and self.since_probe >= self.gap
        return self._other(self.leader) if probing else self.leader

    def record(self, arm: Arm, rate: float, max_gap: int, seconds: float | None = None) -> bool:
        """A window of `arm` ran at `rate` (and took `seconds`, if it ran all its steps). A probe waits for the
        leader's next window; then its rate against the geometric mean of its two neighbours updates the advantage,
        and the leader and the gap are chosen again. Neighbours more than NEIGHBOURS_AGREE apart (the workload
        changed across the probe) judge nothing: the next probe comes after `gap` windows, as after any. Whether the
        lead changed."""
        self._count(arm, rate)
        if arm is self.leader and seconds is not None:
            self.lead_seconds = ema(self.lead_seconds, seconds)
        if arm is not self.leader:
            self.probe, self.since_probe = rate, 0
            return False
        if self.probe is not None:
            before, probe, self.probe = self.before or rate, self.probe, None
            if max(before, rate) > NEIGHBOURS_AGREE * min(before, rate):
                self.since_probe, self.before = 0, rate  # the workload changed across it: the next probe, as usual
                return False
            paired = probe / math.sqrt(before * rate)
            sample = math.log(paired) if arm is self.second else -math.log(paired)
            self.advantage = ema(self.advantage, sample)
            if self._choose(max_gap, contradicted=self._faster(sample) is not self.leader):
                self.since_probe, self.before = 0, None  # the new leader's windows are measured from now
                return True
        self.since_probe, self.before = self.since_probe + 1, rate
        return False

    def as_dict(self) -> dict:
        """The state as JSON-ready values (arms by name)."""
        state = dataclasses.asdict(self)
        return {key: value.value if isinstance(value, Arm) else value for key, value in state.items()}

    def _choose(self, max_gap: int, contradicted: bool) -> bool:
        """`first` leads while its advantage beats the margin; the next probe comes after max(2 gap,
        loss / EXPLORE_BUDGET) windows, or loss / EXPLORE_BUDGET after a change of lead or a probe that found the
        probed arm faster (`contradicted`: the lead may be wrong, so it is checked again soon, within the budget).
        Whether the lead changed."""
        ratio = math.exp(self.advantage) / (1 + self.margin)  # first over second, the margin taken off
        faster = self._faster(self.advantage)
        loss = 1 - min(ratio, 1 / ratio)  # the share of a probe's time (at most a leader window's) it wastes
        changed = faster is not self.leader
        self.leader = faster
        doubled = 1 if changed or contradicted else 2 * self.gap
        self.gap = max(1, min(max_gap, max(doubled, math.ceil(loss / EXPLORE_BUDGET))))
        return changed

    def _faster(self, advantage: float) -> Arm:
        """The arm that an advantage of `first` (log of its rate over `second`'s) says is faster, the margin
        taken off."""
        return self.first if advantage > math.log1p(self.margin) else self.second

    def _count(self, arm: Arm, rate: float) -> None:
        if arm is self.first:
            self.first_rate, self.first_windows = ema(self.first_rate, rate), self.first_windows + 1
        else:
            self.second_rate, self.second_windows = ema(self.second_rate, rate), self.second_windows + 1

    def _other(self, arm: Arm) -> Arm:
        return self.second if arm is self.first else self.first


@dataclass(frozen=True)
class WindowRecord:
    """One window that ended, as SpecGate.window_log keeps it (profiling)."""

    bucket: Bucket
    arm: Arm
    steps: int
    counted: int  # steps whose drafts were decided in `arm`, without a compile or a stall
    tokens: int  # emitted by the counted steps
    seconds: float  # their wall time
    recorded: bool  # whether it changed the bucket's state (complete, or half counted)
    balance: float = 1.0  # the rate was charged with this (row_balance; 1 unless the batch drained)


class SpecGate:
    """Whether the next steps speculate, and how (see the module docstring). The Speculator asks `plain` and
    `full` before each decision and tells `observe` every step's rows, emitted tokens, wall time, the arm its
    drafts were decided in and whether every row was greedy. full=True: the speculating windows choose between SPEC
    and FULL too (`modes`). While `window_log` is a list, every window that ends is appended to it."""

    def __init__(self, window: int = WINDOW, max_gap: int = MAX_GAP, full: bool = False) -> None:
        self.window, self.max_gap, self.full_arm = window, max_gap, full
        self.buckets: dict[Bucket, BucketState] = {}  # speculation (SPEC) against plain, per bucket
        self.modes: dict[Bucket, BucketState] = {}  # a speculating window's mode: FULL against SPEC (full=True)
        self.window_log: list[WindowRecord] | None = None
        self._arm = Arm.SPEC
        self._held: Arm | None = None  # hold's arm: every window runs in it
        self._bucket: Bucket | None = None  # the window's bucket
        self._bucket_of: dict[tuple[int, bool], Bucket] = {}  # (rows, greedy) -> its bucket (_new_bucket)
        self._steps = 0  # steps of the window so far
        self._seconds = 0.0  # their wall time
        self._limit: float | None = None  # a probe's: it ends once its steps took this long (a leader window's)
        self._counted: list[tuple[int, float]] = []  # (tokens, seconds) of the window's counted steps
        self._outputs: dict[str, int] | None = None  # request id -> output tokens after its first step (draining)

    @property
    def arm(self) -> Arm:
        """The current window's arm."""
        return self._arm

    @property
    def plain(self) -> bool:
        """Whether the current window runs without speculation."""
        return self._arm is Arm.PLAIN

    @property
    def full(self) -> bool:
        """Whether the current window drafts without the policy (up to k for every request that may draft)."""
        return self._arm is Arm.FULL

    def hold(self, arm: Arm | None) -> None:
        """Run every window in `arm` from now on (None: choose by the buckets' states again). A measurement's
        switch, not a policy: the bench's METHOD-plain rows hold PLAIN to show what a plain window's step costs
        against an engine without speculation (lamina/bench/spec.py). Held windows are logged, not recorded; the
        window so far is dropped (the next step starts one), so none spans a change of hold; after hold(None) the
        next step speculates, as a new gate's first."""
        self._held, self._bucket = arm, None
        self._arm = Arm.SPEC if arm is None else arm

    def observe(self, num_rows: int, num_tokens: int, seconds: float, arm: Arm, countable: bool = True,
                greedy: bool = False, draining: Sequence[Request] = ()) -> None:
        """One step of `num_rows` rows emitted `num_tokens` tokens in `seconds`. `arm`: the arm its drafts were
        decided in (the window's when it counts); countable: it compiled no kernel; greedy: every row is;
        draining: the step's requests when none waits to be admitted (the batch drains: its slowest row is
        charged, row_balance), else empty."""
        if num_rows <= 0:
            return
        bucket = self._bucket_of.get((num_rows, greedy)) or self._new_bucket(num_rows, greedy)
        if bucket != self._bucket:
            self._end_window(False, draining)
            self._start_window(bucket)
        self._steps += 1
        self._seconds += seconds
        if self._steps == 1 and len(draining) > 1:  # the rows' outputs after the window's first step (not counted)
            self._outputs = {r.request_id: r.num_output_tokens for r in draining}
        if countable and arm is self._arm:
            self._counted.append((num_tokens, seconds))
        if self._steps >= self.window or (self._limit is not None and self._probe_done()):
            self._end_window(True, draining)
            self._start_window(bucket)

    def _new_bucket(self, num_rows: int, greedy: bool) -> Bucket:
        """The bucket of a step of `num_rows` rows, kept: `observe` runs every step, on the host's critical path
        at small batches, and looks it up instead of building it."""
        bucket = self._bucket_of[num_rows, greedy] = Bucket(batch_bucket(num_rows), greedy)
        return bucket

    def _probe_done(self) -> bool:
        """Whether a probe (a window with `_limit` set) has taken a leader window's time (and run MIN_PROBE_STEPS)."""
        return self._steps >= MIN_PROBE_STEPS and self._seconds >= self._limit

    def _start_window(self, bucket: Bucket) -> None:
        self._bucket, self._steps, self._seconds, self._counted, self._limit = bucket, 0, 0.0, [], None
        self._outputs = None
        state = self.buckets.setdefault(bucket, BucketState())
        if self._held is not None:
            self._arm = self._held
            return
        self._arm, pair = state.next_arm(), state
        if self._arm is Arm.SPEC and self.full_arm:
            if bucket not in self.modes:
                self._start_modes(bucket)
            mode = self.modes[bucket]
            # the modes are compared once speculation leads (its first probe of plain judged); else its leader runs
            explore = state.leader is Arm.SPEC and state.advantage is not None
            self._arm, pair = (mode.next_arm(), mode) if explore else (mode.leader, state)
        if self._arm is not pair.leader:  # a probe: it lasts a leader window's time at most
            self._limit = pair.lead_seconds

    def _end_window(self, complete: bool, draining: Sequence[Request]) -> None:
        if self._bucket is None:
            return
        counted = without_stalls(self._counted)
        tokens, seconds = sum(t for t, _ in counted), sum(s for _, s in counted)
        balance = row_balance(self._outputs, draining) if self._outputs and draining else 1.0
        recorded = self._held is None and seconds > 0 and (complete or 2 * len(counted) >= self.window)
        if recorded:
            self._record(balance * tokens / seconds, self._seconds if self._steps >= self.window else None)
        if self.window_log is not None:
            self.window_log.append(WindowRecord(self._bucket, self._arm, self._steps, len(counted), tokens, seconds,
                                                recorded, balance))

    def _record(self, rate: float, seconds: float | None) -> None:
        """A window's rate (and its time, if it ran all its steps) to its bucket's states: speculation against
        plain (a speculating window only in the mode that leads, so that a probe of the other mode is not taken for
        speculation's rate), and the modes."""
        mode = self.modes[self._bucket] if self.full_arm and not self.plain else None
        if mode is None or self._arm is mode.leader:
            state = self.buckets[self._bucket]
            changed = state.record(Arm.PLAIN if self.plain else Arm.SPEC, rate, self.max_gap, seconds)
            if self.full_arm and changed and state.leader is Arm.PLAIN:
                self._start_modes(self._bucket)
                return
        if mode is not None:
            mode.record(self._arm, rate, self.max_gap, seconds)

    def _start_modes(self, bucket: Bucket) -> None:
        """The bucket's modes from scratch, the policy leading: at its first speculating window, and again when plain
        takes the lead from speculation. Their comparison pauses while plain leads (speculation's probes run in the
        modes' leader), so FULL, had it led on an earlier workload and lost to plain on this one, would run every
        probe of speculation and keep plain leading where the policy might beat it (tests/engine/test_spec_gate_full.py;
        the CPU bench that showed it: docs/BENCHMARKS.md, forty-fifth session)."""
        self.modes[bucket] = BucketState(Arm.FULL, Arm.SPEC, full_margin(bucket.rows), leader=Arm.SPEC)


def without_stalls(steps: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """The (tokens, seconds) steps but those slower than STALL_FACTOR times their median."""
    if len(steps) < 3:
        return steps
    limit = STALL_FACTOR * sorted(s for _, s in steps)[len(steps) // 2]
    return [step for step in steps if step[1] <= limit]


def row_balance(start: dict[str, int], requests: Sequence[Request]) -> float:
    """The tokens of the window's slowest row over its mean row's: among `requests` (at the window's end) those in
    `start` (request id -> output tokens after its first step) that emitted any (a row mid-prompt or preempted all the
    window is slow for other reasons). A batch that must all finish ends with its slowest request: drafts that
    speed the others while verify steps slow it make more tokens a second and a later end (docs/speculative.md),
    so a draining window's rate is charged by this share; a plain window's rows each emit a token a step (1.0)."""
    emitted = [n for r in requests if (n := r.num_output_tokens - start.get(r.request_id, r.num_output_tokens)) > 0]
    return min(emitted) * len(emitted) / sum(emitted) if emitted else 1.0
