"""CUDA graphs replayed against eager steps: on CPU, with `EagerGraph` standing in for a CUDA graph and the Triton
kernels under the interpreter, replayed decode, verify and prompt steps give the eager tokens, greedy ones from the
argmax the graph computed, sampled ones drawn inside the graph as eager steps draw them. Buckets, padding and the
capture decision: test_cuda_graphs.py."""
from __future__ import annotations

import itertools
import logging

import pytest
import torch

import tests.kernels.conftest  # noqa: F401 - TRITON_INTERPRET=1 and the interpreter fixes
from lamina import LLM, SamplingParams
from lamina.graphs import EagerGraph
from lamina.worker.cuda_graphs import CudaGraphRunner, SlotSampling, prefill_query_lens
from lamina.worker.input_batch import HostBatch
from tests.helpers.spec_tree import count_off_chain, perturbed_copy
from tests.helpers.tiny_models import make_tiny_model
from tests.worker.test_cuda_graphs import decode_batch


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(make_tiny_model("qwen3", tmp_path_factory.mktemp("graphs"), hidden_size=64, num_attention_heads=2,
                               num_key_value_heads=1, head_dim=32, num_hidden_layers=2))


def _llm(model_dir: str, **kw: object) -> LLM:
    return LLM(model=model_dir, skip_tokenizer_init=True, attention_backend="triton", device="cpu",
               block_size=8, num_kv_blocks=64, max_num_seqs=8, max_model_len=96, **kw)


def test_cpu_engine_never_captures(model_dir: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="lamina.worker.worker"):
        llm = _llm(model_dir)
    assert llm.engine.executor.worker.runner.graphs is None
    assert "eager: device is cpu" in caplog.text
    assert _llm(model_dir, enforce_eager=True).engine.executor.worker.runner.graphs is None


def _with_eager_graphs(llm: LLM, max_batch_size: int, prefill_tokens: int = 0) -> list[HostBatch]:
    """Capture `llm`'s decode steps (and prompt chunks of up to `prefill_tokens` slots) with EagerGraph standing in
    for CUDA graphs; returns the list of the batches replayed from then on."""
    worker = llm.engine.executor.worker
    graphs = CudaGraphRunner(worker.model, max_batch_size, worker.max_model_len, 8, torch.device("cpu"),
                             graph_cls=EagerGraph, prefill_tokens=prefill_tokens)
    graphs.capture_all()
    replayed: list[HostBatch] = []
    original_run = graphs.run
    graphs.run = lambda batch, graph, *args: replayed.append(batch) or original_run(batch, graph, *args)
    worker.runner.graphs = graphs
    return replayed


def test_replayed_decode_steps_equal_eager(model_dir: str) -> None:
    prompts = [[(5 * i + j) % 256 for j in range(n)] for i, n in enumerate([3, 17, 9, 30, 1])]
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in (12, 5, 9, 14, 7)]
    inputs = [{"prompt_token_ids": p} for p in prompts]
    eager = _llm(model_dir).generate(inputs, params, use_tqdm=False)
    llm = _llm(model_dir)
    replayed = _with_eager_graphs(llm, 6)
    out = llm.generate(inputs, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in out] == [o.outputs[0].token_ids for o in eager]
    sizes = [batch.num_seqs for batch in replayed]
    assert sorted(set(sizes)) == [1, 2, 3, 4, 5] and len(sizes) >= 10  # 5 rows pad into the 6-bucket
    llm.engine.check_integrity()


def _sampler_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows of every sampling the Sampler does from now on (after a replay, or eagerly), one entry each."""
    from lamina.layers.sampler import Sampler

    calls: list[int] = []
    original = Sampler._sample
    monkeypatch.setattr(Sampler, "_sample", lambda self, logits, metadata: calls.append(len(logits)) or
                        original(self, logits, metadata))
    return calls


def assert_same_logprobs(got: list[dict], want: list[dict]) -> None:
    """The same tokens and ranks at every position, their logprobs equal up to float32 rounding: a replayed
    bucket's logits are those of a padded batch, whose matmuls some CPUs round differently (seen on an AMD EPYC,
    not on an Intel Xeon)."""
    assert [{t: lp.rank for t, lp in pos.items()} for pos in got] == [{t: lp.rank for t, lp in pos.items()}
                                                                      for pos in want]
    for g, w in zip(got, want):
        assert all(abs(g[t].logprob - w[t].logprob) <= 1e-5 for t in w), (g, w)


def _kernel_sampling(llm: LLM) -> LLM:
    """`llm` sampling with the Triton kernel (the interpreter on CPU), as on a GPU: graphs and eager steps draw the
    same tokens from the same keys."""
    llm.engine.executor.worker.runner.kernel_sampling = True
    return llm


def test_greedy_steps_replayed_take_the_graphs_argmax(model_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A greedy decode step replayed in a small bucket samples nothing itself: its tokens are the argmax the graph
    computed with the logits (no argmax launched from the host); a step with a repetition penalty, whose logits
    change first, samples them as before. Both give the eager engine's tokens."""
    prompts = [[3, 9, 4, 1], [7, 7, 2]]
    plain = [SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)] * 2
    penalised = [SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, repetition_penalty=1.5)] * 2
    inputs = [{"prompt_token_ids": p} for p in prompts]
    sampled = _sampler_calls(monkeypatch)
    for params in (plain, penalised):
        eager = _llm(model_dir).generate(inputs, params, use_tqdm=False)
        llm = _llm(model_dir)
        replayed = _with_eager_graphs(llm, 4)
        sampled.clear()
        out = llm.generate(inputs, params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in out] == [o.outputs[0].token_ids for o in eager]
        decodes = sum(b.max_query_len == 1 for b in replayed)
        assert decodes >= 9
        assert len(sampled) == (1 if params is plain else 1 + decodes), (len(sampled), decodes)  # 1: the prefill
        llm.engine.check_integrity()


def test_replayed_steps_with_one_token_prompt_chunks_equal_eager(model_dir: str) -> None:
    """A token budget of 3 with two requests decoding leaves one token for the third prompt: its chunks
    ride in decode-only batches without sampling, so the graph's rows and the sampling rows differ."""
    prompts = [[5, 6, 7], [9, 10], [(3 * j) % 200 + 1 for j in range(7)]]
    params = [SamplingParams(temperature=0.9, seed=i, max_tokens=12, ignore_eos=True) for i in range(3)]
    inputs = [{"prompt_token_ids": p} for p in prompts]
    eager = _llm(model_dir, max_num_batched_tokens=3).generate(inputs, params, use_tqdm=False)
    llm = _llm(model_dir, max_num_batched_tokens=3)
    replayed = _with_eager_graphs(llm, 4)
    out = llm.generate(inputs, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in out] == [o.outputs[0].token_ids for o in eager]
    # some replayed step had a row that samples nothing
    assert any(len(batch.logits_indices) < batch.num_seqs for batch in replayed)
    llm.engine.check_integrity()


@pytest.mark.parametrize("spec", [
    {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2,
     "adaptive": False},
    {"method": "early_exit", "num_speculative_tokens": 3, "exit_layer": 1, "adaptive": False},  # drafts on the device
    {"method": "draft_model", "model": "DRAFT", "speculative_token_tree": [(0,), (1,), (2,)], "adaptive": False},
], ids=["ngram", "early_exit", "tree"])
def test_replayed_verify_steps_equal_eager(model_dir: str, spec: dict, tmp_path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """With drafts, steps of up to 1 + k tokens a row replay the verify graphs (q = 4) and give the eager
    tokens; plain decode steps still replay the q = 1 graphs. The worker's own drafts (early exit) reach the
    graph's input ids on the device; a tree's mask reaches the graph's decode kernel (a draft model close to the
    target, so that paths leave the main chain)."""
    if spec.get("model") == "DRAFT":
        spec = {**spec, "model": str(perturbed_copy(model_dir, tmp_path / "draft"))}
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [7, 8, 9, 10, 7, 8], [(5 * j) % 64 + 1 for j in range(11)]]
    lengths = (40, 30, 36) if "speculative_token_tree" in spec else (14, 9, 12)  # trees: room for paths off-chain
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in lengths]
    inputs = [{"prompt_token_ids": p} for p in prompts]
    eager = _llm(model_dir, speculative_config=spec).generate(inputs, params, use_tqdm=False)
    llm = _llm(model_dir, speculative_config=spec)
    worker = llm.engine.executor.worker
    graphs = CudaGraphRunner(worker.model, 4, worker.max_model_len, 8, torch.device("cpu"), graph_cls=EagerGraph,
                             query_lens=(1, 4), tree="speculative_token_tree" in spec)
    graphs.capture_all()
    replayed: list[HostBatch] = []
    original_run = graphs.run
    graphs.run = lambda batch, graph, *args: replayed.append(batch) or original_run(batch, graph, *args)
    worker.runner.graphs = graphs
    moves = count_off_chain(monkeypatch)
    out = llm.generate(inputs, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in out] == [o.outputs[0].token_ids for o in eager]
    assert any(b.max_query_len > 1 for b in replayed)
    assert llm.engine.get_stats().spec.num_accepted_tokens > 0
    if "speculative_token_tree" in spec:
        assert any(b.tree_mask is not None and 1 in b.tree_mask[1] for b in replayed)  # node 0 of some tree
        assert sum(moves) >= 2, moves  # accepted paths off the main chain: their rows saw only their ancestors
    else:  # (a tree's requests draft to their last step here)
        assert any(b.max_query_len == 1 for b in replayed)
    llm.engine.check_integrity()


def test_prefill_graphs_hold_small_batches_of_prompt_chunks(model_dir: str) -> None:
    """Prompt chunks of 1, 2 or 4 rows go to the graph of the shortest q >= their longest row (16, 32, .. up to
    prefill_tokens slots a graph); more rows, or a longer row, run eagerly; decode batches keep their graphs."""
    llm = _llm(model_dir)
    worker = llm.engine.executor.worker
    assert prefill_query_lens(512) == [16, 32, 64, 128, 256, 512] and prefill_query_lens(15) == []
    graphs = CudaGraphRunner(worker.model, 6, worker.max_model_len, 8, torch.device("cpu"), graph_cls=EagerGraph,
                             prefill_tokens=64)
    assert {q: s.buckets for q, s in graphs.sets.items()} == {1: [1, 2, 4, 6], 16: [1, 2, 4], 32: [1, 2], 64: [1]}
    assert {q: s.buffers.seq_lens.shape[0] for q, s in graphs.sets.items()} == {1: 6, 16: 4, 32: 2, 64: 1}
    graphs.capture_all()

    def chunks(lens: list[int]) -> HostBatch:
        starts = [0, *itertools.accumulate(lens)]
        return HostBatch(input_ids=[1] * starts[-1], positions=[i for n in lens for i in range(n)],
                         slot_mapping=list(range(starts[-1])), query_start_loc=starts, seq_lens=lens,
                         block_tables=[list(range(1, 9))] * len(lens),
                         logits_indices=[s - 1 for s in starts[1:]], sampling_req_ids=[])
    placed = {tuple(lens): graphs.graph_for(chunks(lens)) for lens in
              ([20], [20, 3], [20, 3, 1], [9, 9, 9, 9], [40], [40, 2], [64], [65], [9] * 5, [1] * 5)}
    where = {lens: None if g is None else (g[0].buffers.query_len, g[1]) for lens, g in placed.items()}
    assert where == {(20,): (32, 1), (20, 3): (32, 2), (20, 3, 1): None, (9, 9, 9, 9): (16, 4), (40,): (64, 1),
                     (40, 2): None, (64,): (64, 1), (65,): None, (9,) * 5: None, (1,) * 5: (1, 6)}
    plain = CudaGraphRunner(worker.model, 6, worker.max_model_len, 8, torch.device("cpu"), graph_cls=EagerGraph)
    assert list(plain.sets) == [1]  # prefill_tokens=0: prompt chunks run eagerly


@pytest.mark.parametrize("budget, lengths", [(None, (40,)), (20, (3, 17, 9, 30, 40))], ids=["alone", "chunked"])
def test_replayed_prompt_chunks_equal_eager(model_dir: str, budget: int | None, lengths: tuple[int, ...]) -> None:
    """Prompts prefilled in graphs (one prompt alone; chunks of several prompts beside decodes under a small
    token budget) give the tokens of eager prefills."""
    prompts = [[(5 * i + j) % 256 for j in range(n)] for i, n in enumerate(lengths)]
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in (12, 5, 9, 14, 7)[:len(lengths)]]
    inputs = [{"prompt_token_ids": p} for p in prompts]
    kw = {} if budget is None else {"max_num_batched_tokens": budget}
    eager = _llm(model_dir, **kw).generate(inputs, params, use_tqdm=False)
    llm = _llm(model_dir, **kw)
    replayed = _with_eager_graphs(llm, 6, prefill_tokens=64)
    out = llm.generate(inputs, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in out] == [o.outputs[0].token_ids for o in eager]
    prefills = {(b.num_seqs, b.max_query_len) for b in replayed if b.max_query_len > 8}
    if budget is None:
        assert prefills == {(1, 40)}
    else:  # chunks of several prompts (and decodes beside them) replayed
        assert any(rows > 1 for rows, _ in prefills), prefills
    llm.engine.check_integrity()


def test_small_buckets_compute_their_logits_inside_the_graph(model_dir: str) -> None:
    """A bucket of at most LOGITS_IN_GRAPH_TOKENS token slots hands back the logits of its rows from the replay (the
    LM head captured with the model), equal to the LM head run after it; a larger bucket hands back none."""
    from lamina.worker import cuda_graphs

    llm = _llm(model_dir)
    worker = llm.engine.executor.worker
    graphs = CudaGraphRunner(worker.model, 8, worker.max_model_len, 8, torch.device("cpu"), graph_cls=EagerGraph,
                             query_lens=(1, 16))
    graphs.capture_all()
    batch = decode_batch([[3, 5], [7], [2, 4, 6]], [10, 5, 20], block_size=8)
    with torch.inference_mode():  # as the model runner runs it
        out = graphs.run(batch, graphs.graph_for(batch))
        hidden, logits, argmax = out.hidden, out.logits, out.argmax
        assert out.sampled is None  # nothing to sample
        assert logits is not None and logits.shape == (3, worker.arch.vocab_size)
        assert logits.data_ptr() == graphs.logits.data_ptr()  # the one buffer every small graph writes
        torch.testing.assert_close(logits, worker.model.compute_logits(hidden))
        assert argmax.tolist() == logits.argmax(dim=-1).tolist() and argmax.data_ptr() == graphs.argmax.data_ptr()
        single = decode_batch([[9]], [4], block_size=8)
        one = graphs.run(single, graphs.graph_for(single))  # another graph
        torch.testing.assert_close(one.logits, worker.model.compute_logits(one.hidden))
        assert one.argmax.tolist() == one.logits.argmax(dim=-1).tolist()
        # five rows of two tokens: bucket 8 of q = 16, 128 slots, more than the graphs compute logits for
        five = HostBatch(input_ids=list(range(1, 11)), positions=[4, 5] * 5, slot_mapping=[4, 5] * 5,
                         query_start_loc=list(range(0, 11, 2)), seq_lens=[6] * 5, block_tables=[[1]] * 5,
                         logits_indices=list(range(1, 10, 2)), sampling_req_ids=[])
        assert 8 * 16 > cuda_graphs.LOGITS_IN_GRAPH_TOKENS
        big = graphs.run(five, graphs.graph_for(five))
        assert big.logits is None and big.argmax is None and big.sampled is None
    assert graphs.logits.shape == (cuda_graphs.LOGITS_IN_GRAPH_TOKENS, worker.arch.vocab_size)


def test_small_buckets_sample_the_slots_they_are_given(model_dir: str) -> None:
    """A graph that samples draws each given slot as the sampling kernel draws its logits row with the same key,
    temperature, top-p and min-p, and copies the argmax of every other slot; the next replay without sampling sets
    every temperature back to 0 (an argmax copy, whatever the last keys were)."""
    pytest.importorskip("triton")
    from lamina.kernels import sampling

    llm = _llm(model_dir)
    worker = llm.engine.executor.worker
    graphs = CudaGraphRunner(worker.model, 4, worker.max_model_len, 8, torch.device("cpu"), graph_cls=EagerGraph,
                             sample=True)
    graphs.capture_all()
    batch = decode_batch([[3, 5], [7], [2, 4, 6]], [10, 5, 20], block_size=8)
    given = SlotSampling(slots=[0, 2], keys=[11, -7], temperature=[0.9, 1.7], top_p=[1.0, 0.8], min_p=[0.05, 0.0])
    graph = graphs.graph_for(batch)
    assert graphs.samples(graph)
    with torch.inference_mode():
        out = graphs.run(batch, graph, sampling=given)
        logits = out.logits.clone()
        expected = sampling.sample(logits[[0, 2]], torch.tensor(given.temperature), torch.tensor(given.keys),
                                   top_p=torch.tensor(given.top_p), min_p=torch.tensor(given.min_p))
        tokens = out.sampled.tolist()
        assert [tokens[0], tokens[2]] == expected.tolist() and tokens[1] == logits[1].argmax()
        assert graphs.sampling_rows[1, 4:].eq(0).all()  # padding slots: greedy
        again = graphs.run(batch, graph)
        assert again.sampled is None and graphs.sampling_rows[1].eq(0).all()
        assert graphs.sampled[:3].tolist() == again.argmax.tolist()
    assert not CudaGraphRunner(worker.model, 4, worker.max_model_len, 8, torch.device("cpu"),
                               graph_cls=EagerGraph).samples(graph)


def test_sampled_steps_replayed_draw_inside_the_graph_as_eager_steps_draw(model_dir: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """With the sampling kernel on both sides (the interpreter on CPU), decode steps replayed in a small bucket give
    the eager engine's tokens, seeded and unseeded, with top-p, min-p, logprobs and a greedy row beside them, and
    launch no sampling of their own (the graph drew them); a step with a row that uses top-k samples after the
    replay, as before, with the same tokens."""
    pytest.importorskip("triton")
    prompts = [[3, 9, 4, 1], [7, 7, 2], [5, 1]]
    in_graph = [SamplingParams(temperature=0.8, seed=4, max_tokens=6, ignore_eos=True, logprobs=2),
                SamplingParams(temperature=1.1, top_p=0.9, min_p=0.05, max_tokens=6, ignore_eos=True),
                SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)]
    with_top_k = in_graph[:2] + [SamplingParams(temperature=0.7, top_k=5, max_tokens=6, ignore_eos=True)]
    inputs = [{"prompt_token_ids": p} for p in prompts]
    sampled = _sampler_calls(monkeypatch)
    for params in (in_graph, with_top_k):
        expected = _kernel_sampling(_llm(model_dir, seed=3)).generate(inputs, params, use_tqdm=False)
        llm = _kernel_sampling(_llm(model_dir, seed=3))
        worker = llm.engine.executor.worker
        runner = worker.runner
        runner.graphs = CudaGraphRunner(worker.model, 4, worker.max_model_len, 8, torch.device("cpu"),
                                        graph_cls=EagerGraph, sample=True)
        runner.graphs.capture_all()
        sampled.clear()
        out = llm.generate(inputs, params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in out] == [o.outputs[0].token_ids for o in expected]
        assert len({tuple(o.outputs[0].token_ids) for o in out[:2]}) == 2
        assert_same_logprobs(out[0].outputs[0].logprobs, expected[0].outputs[0].logprobs)
        decodes = 5  # 6 tokens: one from the prompt step, five from decode steps of all three rows
        assert len(sampled) == (1 if params is in_graph else 1 + decodes), sampled
        llm.engine.check_integrity()


@pytest.mark.parametrize("spec", [
    {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2,
     "adaptive": False},
    {"method": "draft_model", "model": "DRAFT", "speculative_token_tree": [(0,), (1,), (2,)], "adaptive": False},
], ids=["ngram", "tree"])
def test_sampled_verify_steps_replayed_draw_inside_the_graph_as_eager_steps_draw(
        model_dir: str, spec: dict, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Verify steps that sample: the graph draws every row (the drafting rows keyed by their salts, then the plain
    rows, as the runner's two sampling calls key them), the drafts are accepted from those tokens, and the output
    is the eager engine's, token for token, with no sampling launched after any replay (the sampling kernel on
    both sides, under the interpreter)."""
    pytest.importorskip("triton")
    if spec.get("model") == "DRAFT":
        spec = {**spec, "model": str(perturbed_copy(model_dir, tmp_path / "draft"))}
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [7, 8, 9, 10, 7, 8], [(5 * j) % 64 + 1 for j in range(11)]]
    params = [SamplingParams(temperature=0.3, seed=7, max_tokens=12, ignore_eos=True, logprobs=1),
              SamplingParams(temperature=0.5, top_p=0.9, max_tokens=10, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=11, ignore_eos=True)]
    inputs = [{"prompt_token_ids": p} for p in prompts]
    sampled = _sampler_calls(monkeypatch)
    expected = _kernel_sampling(_llm(model_dir, speculative_config=spec, seed=5)).generate(inputs, params,
                                                                                          use_tqdm=False)
    llm = _kernel_sampling(_llm(model_dir, speculative_config=spec, seed=5))
    worker = llm.engine.executor.worker
    graphs = CudaGraphRunner(worker.model, 4, worker.max_model_len, 8, torch.device("cpu"), graph_cls=EagerGraph,
                             query_lens=(1, 4), tree="speculative_token_tree" in spec, sample=True)
    graphs.capture_all()
    replayed: list[HostBatch] = []
    original_run = graphs.run
    graphs.run = lambda batch, graph, *args: replayed.append(batch) or original_run(batch, graph, *args)
    worker.runner.graphs = graphs
    sampled.clear()
    out = llm.generate(inputs, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in out] == [o.outputs[0].token_ids for o in expected]
    got, want = out[0].outputs[0].logprobs, expected[0].outputs[0].logprobs  # the logits of a graph of 4-token rows
    assert [{t: lp.rank for t, lp in d.items()} for d in got] == [{t: lp.rank for t, lp in d.items()} for d in want]
    assert [lp.logprob for d in got for lp in d.values()] == pytest.approx(  # differ from the eager ones in the
        [lp.logprob for d in want for lp in d.values()], abs=1e-5)  # last bits
    assert sum(b.max_query_len > 1 for b in replayed) >= 2 and llm.engine.get_stats().spec.num_accepted_tokens > 0
    assert len(sampled) == 1, sampled  # the prompts' step, eager: every replayed step sampled in its graph
    llm.engine.check_integrity()
