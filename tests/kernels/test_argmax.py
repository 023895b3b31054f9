"""The two-pass argmax (lamina.kernels.argmax) against torch.argmax under the interpreter: ties inside a chunk and
across chunks, a partial last chunk, rows of -inf, NaN and +inf, bf16 logits and rows of a wider tensor."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from lamina.kernels.argmax import BLOCK, argmax, reference  # noqa: E402

V = 2 * BLOCK + 37  # three chunks, the last one partial


def planted() -> torch.Tensor:
    """Rows whose answers a chunk-local or right-biased reduction would get wrong."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, V, generator=g)
    x[0, 5] = x[0, BLOCK + 3] = 9.0  # a tie across chunks: the first chunk's column
    x[1, BLOCK + 3] = x[1, 2 * BLOCK + 1] = 9.0  # ... not the first chunk
    x[2, BLOCK - 1] = x[2, BLOCK] = 9.0  # a tie across a chunk boundary
    x[3, V - 1] = 9.0  # the last column of the partial chunk
    x[4] = float("-inf")  # no finite logit: column 0, as torch
    x[5, 7] = float("inf")
    x[5, BLOCK + 9] = float("nan")  # NaN counts as +inf: the first of them
    x[6, 2 * BLOCK + 2] = float("nan")
    x[7, 40] = x[7, 41] = 9.0  # a tie inside one chunk
    return x


def test_argmax_matches_torch_on_planted_rows() -> None:
    x = planted()
    expected = [5, BLOCK + 3, BLOCK - 1, V - 1, 0, 7, 2 * BLOCK + 2, 40]
    assert reference(x).tolist() == expected
    assert argmax(x).tolist() == expected
    finite = [0, 1, 2, 3, 4, 7]  # rows without NaN: torch.argmax itself
    assert argmax(x)[finite].tolist() == x[finite].argmax(dim=-1).tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_argmax_random_rows_and_strided_views(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(1)
    wide = torch.randn(5, V + 64, generator=g).to(dtype)  # bf16: many ties (8 bits of mantissa)
    x = wide[:, 16:16 + V]  # rows of a wider tensor: row stride V + 64
    assert torch.equal(argmax(x), x.argmax(dim=-1))
    small = torch.randn(3, 10, generator=g).to(dtype)  # one partial chunk
    assert torch.equal(argmax(small), small.argmax(dim=-1))


def test_argmax_rejects_and_empties() -> None:
    assert argmax(torch.zeros(0, 10)).shape == (0,)
    with pytest.raises(AssertionError, match="last dim must be contiguous"):
        argmax(torch.zeros(10, 4).t())
