"""The sorting-free sampling kernel against the exact distributions and the torch sampler (interpreter).

The interpreter runs one program (row) at a time and Philox costs ~10 ms a row there, so the chi-square
cases draw 600 samples; the bound still rejects the nearby wrong distribution of each case. The GPU check
(scripts/gpu_check.py) repeats them with 200k samples at the real vocabulary size.
"""
from __future__ import annotations

import random
import threading

import pytest
import torch

pytest.importorskip("triton")

from lamina.kernels import sampling  # noqa: E402
from lamina.layers.sampler import apply_min_p, apply_top_k_top_p, sample_with_kernel  # noqa: E402
from lamina.layers.sampling_metadata import philox_keys  # noqa: E402
from lamina.sampling_params import SamplingParams  # noqa: E402
from tests.helpers.sampling import metadata_for
from tests.layers.test_sampler import LOGITS8, accepts, make_request, ref_dist  # noqa: E402

N = 600
CPU = torch.device("cpu")


def rows(values: list[float], n: int) -> torch.Tensor:
    return torch.tensor([values] * n, dtype=torch.float32)


def full(value: float, n: int) -> torch.Tensor:
    return torch.full((n,), value, dtype=torch.float32)


def keys(n: int, base: int = 12345) -> torch.Tensor:
    return torch.arange(n, dtype=torch.int64) * 7919 + base


def kernel_counts(n: int = N, temperature: float = 1.0, top_p: float | None = None, min_p: float | None = None,
                  top_k: int | None = None, block_v: int = 8) -> torch.Tensor:
    logits = rows(LOGITS8, n)
    kth = None if top_k is None else full(sorted(LOGITS8, reverse=True)[top_k - 1], n)
    tokens = sampling.sample(logits, full(temperature, n), keys(n), top_p=None if top_p is None else full(top_p, n),
                             min_p=None if min_p is None else full(min_p, n), kth=kth, block_v=block_v)
    return torch.bincount(tokens, minlength=len(LOGITS8))


CASES = [  # (kernel kwargs, exact reference, a wrong reference the test must reject)
    (dict(temperature=0.6), dict(temperature=0.6), dict(temperature=0.9)),
    (dict(top_p=0.8), dict(top_p=0.8), dict(top_p=0.95)),
    (dict(temperature=1.3, top_k=6, top_p=0.9, min_p=0.3),
     dict(temperature=1.3, top_k=6, top_p=0.9, min_p=0.3), dict(temperature=1.3, top_k=6, top_p=0.9)),
]


@pytest.mark.parametrize("kwargs,exact,wrong", CASES)
def test_kernel_matches_exact_distribution(kwargs: dict, exact: dict, wrong: dict) -> None:
    counts = kernel_counts(**kwargs)
    expected = ref_dist(LOGITS8, **exact)
    assert counts[expected == 0].sum() == 0
    assert accepts(counts, expected)
    assert not accepts(counts, ref_dist(LOGITS8, **wrong))


def test_greedy_rows_take_the_first_argmax_across_tiles() -> None:
    torch.manual_seed(0)
    logits = torch.randn(6, 37)
    logits[2, 5] = logits[2, 30] = logits[2].max() + 1.0  # a tie across tiles: the first index wins
    tokens = sampling.sample(logits, full(0.0, 6), keys(6), block_v=8)
    assert tokens.tolist() == logits.argmax(dim=-1).tolist()
    assert tokens[2] == 5


def test_samples_stay_in_the_reference_set_across_tiles() -> None:
    """Top-k, top-p and min-p together over 5 tiles: every draw is in the set the torch path keeps."""
    torch.manual_seed(1)
    n, vocab = 60, 40
    logits = (torch.randn(vocab) * 2).repeat(n, 1)
    top_k, top_p, min_p = 12, 0.6, 0.05
    kept = apply_top_k_top_p(logits[:1], torch.tensor([top_k]), top_k, torch.tensor([top_p]))
    allowed = apply_min_p(kept.softmax(dim=-1), torch.tensor([min_p]))[0] > 0
    kth = full(logits[0].topk(top_k).values[-1].item(), n)
    tokens = sampling.sample(logits, full(1.0, n), keys(n), top_p=full(top_p, n), min_p=full(min_p, n), kth=kth,
                             block_v=8)
    assert allowed[tokens].all()
    assert len(set(tokens.tolist())) > 1


def test_a_row_depends_only_on_its_key() -> None:
    """Same key -> same token, whatever else is in the batch and wherever the row sits."""
    torch.manual_seed(2)
    row = torch.randn(24)
    batch = sampling.sample(row.repeat(4, 1), full(1.0, 4), torch.tensor([7, 8, 9, 10]), top_p=full(0.9, 4),
                            block_v=8)
    alone = sampling.sample(row.repeat(1, 1), full(1.0, 1), torch.tensor([9]), top_p=full(0.9, 1), block_v=8)
    moved = sampling.sample(row.repeat(2, 1), full(1.0, 2), torch.tensor([9, 3]), top_p=full(0.9, 2), block_v=8)
    assert batch[2] == alone[0] == moved[0]
    many = sampling.sample(row.repeat(40, 1), full(1.0, 40), keys(40), block_v=8)
    assert len(set(many.tolist())) > 3  # different keys give different draws


def test_greedy_rows_copy_a_given_argmax_and_float64_rows_sample_as_float32() -> None:
    """The CUDA graphs' call (lamina/worker/cuda_graphs.py): rows of temperature 0 take the argmax they are given
    (a wrong one shows it was copied, not recomputed); the sampled rows draw what float32 parameters draw."""
    torch.manual_seed(3)
    logits = torch.randn(5, 37)
    temperature = torch.tensor([0.0, 0.7, 0.0, 1.3, 0.9])
    top_p, min_p = torch.tensor([1.0, 0.8, 1.0, 1.0, 0.95]), torch.tensor([0.0, 0.0, 0.0, 0.1, 0.0])
    given = torch.tensor([4, 0, 9, 0, 0])
    reference = sampling.sample(logits, temperature, keys(5), top_p=top_p, min_p=min_p, block_v=8)
    out = torch.full((5,), -1, dtype=torch.int64)
    tokens = sampling.sample(logits, temperature.double(), keys(5), top_p=top_p.double(), min_p=min_p.double(),
                             block_v=8, argmax=given, out=out)
    assert tokens.data_ptr() == out.data_ptr()
    assert tokens.tolist() == [4, reference[1], 9, reference[3], reference[4]]
    assert reference[0] == logits[0].argmax() and reference[2] == logits[2].argmax() != 9


def test_sampler_kernel_path_mixes_greedy_top_k_and_seeded_rows() -> None:
    """Through the Sampler's kernel dispatch: metadata built from requests, kth from top-k."""
    params = [SamplingParams(temperature=0.0), SamplingParams(top_k=2, seed=5), SamplingParams(top_p=0.5),
              SamplingParams(temperature=0.8, min_p=0.2)]
    requests = [make_request(f"r{i}", p) for i, p in enumerate(params)]
    row_keys = philox_keys([p.seed for p in params], [3] * 4, step_key=99)
    generators = {"r1": torch.Generator().manual_seed(5)}  # the torch path's; the kernel ignores it
    metadata = metadata_for(requests, generators, 8, CPU, row_keys)
    logits = rows(LOGITS8, 4)
    tokens = [sample_with_kernel(sampling, logits, metadata).tolist() for _ in range(3)]
    assert all(t[0] == 2 for t in tokens)  # greedy
    assert all(t[1] in (2, 6) for t in tokens)  # top-2
    assert all(t[2] in (2, 6) for t in tokens)  # top-p 0.5: 0.347 + 0.232 reaches it
    assert tokens[0] == tokens[1] == tokens[2]  # same keys, same draws


def test_philox_keys_depend_on_seed_and_position_only() -> None:
    seeded = make_request("a", SamplingParams(seed=2**63 - 5))  # the largest seeds (int64) are valid key sources
    free = make_request("b", SamplingParams())
    first = philox_keys([seeded.sampling_params.seed, free.sampling_params.seed], [10, 4], step_key=500)
    again = philox_keys([free.sampling_params.seed, seeded.sampling_params.seed], [4, 10], step_key=77)
    assert first[0] == again[1]
    assert first[1] == 501 and again[0] == 77
    assert philox_keys([seeded.sampling_params.seed], [11], step_key=0)[0] != first[0]
    assert all(-2**63 <= k < 2**63 for k in first)


def test_the_runner_picks_the_path_and_keyed_rows_need_no_generators() -> None:
    """CPU logits take the torch path; rows keyed for the kernel need no torch generator, even when seeded."""
    from lamina.layers.sampler import uses_sampling_kernel

    assert not uses_sampling_kernel(CPU)
    seeded = [make_request("s", SamplingParams(seed=3, temperature=0.9))]
    with pytest.raises(ValueError, match="generator"):  # the torch path needs the request's generator
        metadata_for(seeded, {}, 8, CPU)
    keyed = metadata_for(seeded, {}, 8, CPU, philox_keys([seeded[0].sampling_params.seed], [5], step_key=1))
    assert keyed.generators == {} and keyed.seeds is not None


@pytest.mark.parametrize("value", [float("-inf"), float("nan")])
def test_top_p_ends_on_a_row_with_no_finite_logit(value: float) -> None:
    """A row of -inf (or NaN) logits has no top token to accept: the rejection loop must still end (it spun
    forever on the GPU when an engine's warm-up sampled the garbage of a skipped kernel), with a token id in
    range; the finite rows beside it are unaffected."""
    logits = torch.randn(3, 20)
    logits[1] = value
    done: list[torch.Tensor] = []
    worker = threading.Thread(target=lambda: done.append(
        sampling.sample(logits, full(1.0, 3), keys(3), top_p=full(0.9, 3), block_v=8)), daemon=True)
    worker.start()
    worker.join(timeout=120)
    assert done, "the sampling kernel did not end"
    tokens = done[0]
    assert ((tokens >= 0) & (tokens < 20)).all()
    alone = sampling.sample(logits[[0, 2]], full(1.0, 2), keys(3)[[0, 2]], top_p=full(0.9, 2), block_v=8)
    assert tokens[[0, 2]].tolist() == alone.tolist()


def test_philox_keys_of_a_few_seeded_rows_equal_the_batched_ones() -> None:
    """Up to FEW_SEEDED_ROWS seeded rows are keyed with Python ints, more with numpy: the same keys (seeds of any
    size and sign, as seeded_keys takes their low 64 bits)."""
    from lamina.layers.sampling_metadata import FEW_SEEDED_ROWS

    rng = random.Random(4)
    seeds = [rng.choice([rng.randrange(2**80), -rng.randrange(2**40), rng.randrange(100), None])
             for _ in range(3 * FEW_SEEDED_ROWS)]
    positions = [rng.randrange(5000) for _ in seeds]
    many = philox_keys(seeds, positions, step_key=2**63 - 3)
    assert sum(s is not None for s in seeds) > FEW_SEEDED_ROWS  # the numpy path
    for row, (seed, position) in enumerate(zip(seeds, positions)):
        one = philox_keys([None] * row + [seed], [0] * row + [position], step_key=2**63 - 3)  # the Python one
        assert one[row] == many[row]
