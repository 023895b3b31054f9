"""SpecGate while the batch drains (no request waits): a window's rate is charged by its slowest row."""
from __future__ import annotations

from dataclasses import dataclass

from lamina import SamplingParams
from lamina.engine.spec_gate import Arm, SpecGate, row_balance
from tests.helpers.spec_cases import NGRAM_K3, REPEATING, tiny_llm
from tests.helpers.tiny_models import make_tiny_model


@dataclass
class Row:
    request_id: str
    num_output_tokens: int = 0


def test_row_balance_is_the_slowest_rows_share_of_the_mean() -> None:
    rows = [Row("a", 16), Row("b", 8), Row("c", 5), Row("new", 3)]
    # since the start a emitted 6, b 2; c none (mid-prompt or preempted: left out); "new" was not there
    assert row_balance({"a": 10, "b": 6, "c": 5}, rows) == 2 * 2 / 8
    assert row_balance({"a": 13, "b": 5}, rows[:2]) == 1.0  # 3 each
    assert row_balance({"c": 5}, rows) == 1.0  # nobody emitted: nothing to charge


def run_batch(gate: SpecGate, steps: int, draining: bool) -> None:
    """A batch of 8 rows: a speculating step gives rows 0-3 three tokens and rows 4-7 one in 1/600 s (9,600 tokens
    a second), a plain step one token each in 1/1000 s (8,000): 1.2x the tokens a second, the slow half's end 1.67x
    later."""
    rows = [Row(f"r{i}") for i in range(8)]
    for _ in range(steps):
        arm = gate.arm
        speculating = arm is not Arm.PLAIN
        for i, row in enumerate(rows):
            row.num_output_tokens += 3 if speculating and i < 4 else 1
        tokens = 16 if speculating else 8
        gate.observe(8, tokens, 1 / 600 if speculating else 1 / 1000, arm, draining=rows if draining else ())


def test_a_draining_batch_runs_plain_where_drafts_leave_its_slowest_rows_behind() -> None:
    gate = SpecGate()
    gate.window_log = []
    run_batch(gate, 40 * 16, draining=True)
    state = gate.buckets[8, False]
    assert state.leader is Arm.PLAIN
    assert abs(state.first_rate - 0.5 * 9600) < 1 and abs(state.second_rate - 8000) < 1
    assert {w.balance for w in gate.window_log if w.arm is Arm.PLAIN} == {1.0}
    assert {w.balance for w in gate.window_log if w.arm is Arm.SPEC} == {0.5}
    late = gate.window_log[-20:]
    assert sum(w.arm is Arm.PLAIN for w in late) >= 19


def test_with_requests_waiting_tokens_a_second_decide() -> None:
    """The same batch with requests waiting (a row that ends is replaced): speculation's 1.2x leads."""
    gate = SpecGate()
    run_batch(gate, 40 * 16, draining=False)
    state = gate.buckets[8, False]
    assert state.leader is Arm.SPEC and abs(state.first_rate - 9600) < 1


def test_the_engine_tells_the_gate_when_its_batch_drains(tmp_path) -> None:  # noqa: ANN001
    """A fixed batch (all admitted, none waiting) of a prompt n-gram drafts for and prompts it finds nothing in: the
    speculating windows are charged with the rows left behind; plain windows are not charged."""
    model = make_tiny_model("llama", tmp_path / "m", vocab_size=320)
    llm = tiny_llm(model, speculative_config=NGRAM_K3)
    gate = llm.engine.speculator.gate
    gate.window_log = []
    prompts = REPEATING * 2 + [{"prompt_token_ids": [11 + 17 * i + j for j in range(8)]} for i in range(2)]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=96, ignore_eos=True), use_tqdm=False)
    windows = [w for w in gate.window_log if w.bucket.rows == 4]
    assert any(w.arm is not Arm.PLAIN and w.balance < 1 for w in windows)
    assert all(w.balance == 1.0 for w in windows if w.arm is Arm.PLAIN)
    llm.engine.check_integrity()
