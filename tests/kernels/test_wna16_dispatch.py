"""lamina.quant.wna16.kernel_for: which quantized layers take the Triton GEMVs / GEMM, and that a layer computes
the same through them as through its reference path (dispatch.on_kernel_device is patched so that CPU tensors
route as CUDA ones would; the kernels run under the interpreter)."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from lamina.config import KernelChoice  # noqa: E402
from lamina.kernels import wna16_gemm, wna16_gemv, wna16_mma, wna16_row, wna16_tc  # noqa: E402
from lamina.layers import dispatch  # noqa: E402
from lamina.layers.linear import MergedColumnParallelLinear  # noqa: E402
from lamina.quant.config import WeightQuantArgs  # noqa: E402
from lamina.quant.packing import pack_int32  # noqa: E402
from lamina.quant.wna16 import TC_ONE_ROW_MIN_N, WNA16LinearMethod, _takes_tc, kernel_for  # noqa: E402
from tests.kernels.test_wna16 import assert_matches  # noqa: E402

pytestmark = pytest.mark.usefixtures("bf16_round_to_nearest")
IN, OUT = (64, [24, 13])  # a fused layer of two shards, 37 rows in all


def _layer(args: WeightQuantArgs, kernels: KernelChoice = KernelChoice(), seed: int = 0,
           dtype: torch.dtype = torch.bfloat16, size: int = IN) -> MergedColumnParallelLinear:
    """A gate_up-like layer in `dtype` (`size` inputs) with random integers, scales, zero points and bias."""
    g = torch.Generator().manual_seed(seed)
    layer = MergedColumnParallelLinear(size, OUT, bias=True, quant_method=WNA16LinearMethod(args),
                                       kernels=kernels).to(dtype)
    rows, groups = sum(OUT), args.num_groups(size)
    lo, hi = -(1 << (args.num_bits - 1)), (1 << (args.num_bits - 1)) - 1
    q = torch.randint(lo, hi + 1, (rows, size), generator=g).to(torch.int8)
    with torch.no_grad():
        if args.layout == "pack-quantized":
            layer.weight_packed.copy_(pack_int32(q, args.num_bits))
        else:
            layer.weight.copy_(q)
        layer.weight_scale.copy_(torch.rand(rows, groups, generator=g) * 0.01 + 0.002)
        layer.bias.copy_(torch.randn(rows, generator=g))
        if not args.symmetric:
            layer.weight_zero_point.copy_(torch.randint(lo, hi + 1, (rows, groups), generator=g).to(torch.int8))
    layer.quant_method.process_after_loading(layer)
    return layer


@pytest.fixture
def kernel_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """CPU tensors route as CUDA ones; records (kernel, rows) of every quantized kernel call."""
    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(dispatch, "on_kernel_device", lambda x: True)
    for module, name in ((wna16_row, "wna16_row_gemv"), (wna16_gemv, "wna16_gemv"), (wna16_mma, "wna16_mma"),
                         (wna16_gemm, "wna16_matmul"), (wna16_tc, "wna16_tc_gemv")):
        def counting(x: torch.Tensor, *a, _f=getattr(module, name), _n=name, **kw) -> torch.Tensor:
            calls.append((_n, x.shape[0]))
            return _f(x, *a, **kw)
        monkeypatch.setattr(module, name, counting)
    return calls


ARGS = [WeightQuantArgs(4, False, "group", 32), WeightQuantArgs(8, True, "channel"),
        WeightQuantArgs(8, False, "group", 16, layout="naive-quantized")]


@pytest.mark.parametrize("args", ARGS, ids=lambda a: f"int{a.num_bits}-{a.strategy}-{a.layout}")
def test_layer_routes_rows_and_matches_the_reference(args: WeightQuantArgs,
                                                     kernel_calls: list[tuple[str, int]]) -> None:
    layer = _layer(args)
    g = torch.Generator().manual_seed(1)
    for shape in [(1, IN), (2, 2, IN), (2, IN), (3, IN), (16, IN), (3, 7, IN)]:
        x = torch.randn(*shape, generator=g).to(torch.bfloat16)
        expected = torch.nn.functional.linear(x, layer.quant_method.dequantized_weight(layer), layer.bias)
        out = layer(x)
        assert out.shape == (*shape[:-1], sum(OUT))
        assert_matches(out.reshape(-1, sum(OUT)), expected.reshape(-1, sum(OUT)))
    # int8 per channel over K = 64 is one whole chunk of the tensor-core GEMV: it takes the 4 and the 16 rows
    tc = args.num_bits == 8 and args.strategy == "channel"
    four, sixteen = ("wna16_tc_gemv", "wna16_tc_gemv") if tc else ("wna16_row_gemv", "wna16_mma")
    assert kernel_calls == [("wna16_row_gemv", 1), (four, 4), ("wna16_row_gemv", 2), ("wna16_row_gemv", 3),
                            (sixteen, 16), ("wna16_matmul", 21)]


@pytest.mark.parametrize("args,kernels", [
    (WeightQuantArgs(4, False, "group", 128), ["wna16_row_gemv", "wna16_tc_gemv", "wna16_tc_gemv", "wna16_tc_gemv",
                                               "wna16_matmul"]),
    (WeightQuantArgs(8, True, "channel"), ["wna16_row_gemv", "wna16_row_gemv", "wna16_tc_gemv", "wna16_tc_gemv",
                                          "wna16_matmul"])], ids=["int4-g128", "int8-channel"])
def test_tensor_core_gemv_takes_its_rows(args: WeightQuantArgs, kernels: list[str],
                                         kernel_calls: list[tuple[str, int]]) -> None:
    """K whole chunks (128 here): int4 from 2 rows on, int8 from 4 (lamina.quant.wna16._takes_tc), up to 16 rows;
    17 rows the GEMM. Each as the reference."""
    layer = _layer(args, size=128)
    for rows in (1, 3, 4, 16, 17):
        x = torch.randn(rows, 128, generator=torch.Generator().manual_seed(rows)).to(torch.bfloat16)
        expected = torch.nn.functional.linear(x, layer.quant_method.dequantized_weight(layer), layer.bias)
        assert_matches(layer(x), expected)
    assert kernel_calls == list(zip(kernels, (1, 3, 4, 16, 17)))


def test_one_row_takes_the_tensor_core_gemv_for_the_lm_head() -> None:
    """One row: the tensor-core GEMV for int4 weights of at least TC_ONE_ROW_MIN_N rows (the LM head), never at
    int8 (measured slower there)."""
    assert _takes_tc(wna16_tc, 1, TC_ONE_ROW_MIN_N, 4096, 4, 128, torch.bfloat16)
    assert not _takes_tc(wna16_tc, 1, TC_ONE_ROW_MIN_N - 1, 4096, 4, 128, torch.bfloat16)
    assert not _takes_tc(wna16_tc, 1, TC_ONE_ROW_MIN_N, 4096, 8, None, torch.bfloat16)
    assert not _takes_tc(wna16_tc, 1, TC_ONE_ROW_MIN_N, 4096, 4, 32, torch.bfloat16)  # a group of a quarter chunk


@pytest.mark.parametrize("args", ARGS[:2], ids=lambda a: f"int{a.num_bits}-{a.strategy}")
def test_fp16_rows_take_the_fp16_kernels(args: WeightQuantArgs, kernel_calls: list[tuple[str, int]]) -> None:
    """wna16_row reads bf16 x only: one fp16 row takes wna16_gemv, 3 rows the MMA kernel as in bf16."""
    layer = _layer(args, dtype=torch.float16)
    for rows in (1, 3):
        x = torch.randn(rows, IN, generator=torch.Generator().manual_seed(rows)).to(torch.float16)
        expected = torch.nn.functional.linear(x, layer.quant_method.dequantized_weight(layer), layer.bias)
        assert_matches(layer(x), expected)
    assert kernel_calls == [("wna16_gemv", 1), ("wna16_mma", 3)]


def test_groups_the_mma_kernel_does_not_take_run_the_gemv(kernel_calls: list[tuple[str, int]]) -> None:
    """A group of 8 values (one int4 word) is no multiple of 16 (nor of wna16_row's 32): 1..4 rows take the GEMV,
    more the GEMM."""
    args = WeightQuantArgs(4, False, "group", 8)
    layer = _layer(args)
    for rows in (1, 3, 5):
        x = torch.randn(rows, IN, generator=torch.Generator().manual_seed(rows)).to(torch.bfloat16)
        expected = torch.nn.functional.linear(x, layer.quant_method.dequantized_weight(layer), layer.bias)
        assert_matches(layer(x), expected)
    assert kernel_calls == [("wna16_gemv", 1), ("wna16_gemv", 3), ("wna16_matmul", 5)]


def test_gemv_off_takes_the_gemm(kernel_calls: list[tuple[str, int]]) -> None:
    layer = _layer(ARGS[0], KernelChoice(gemv=False))
    layer(torch.randn(1, IN).to(torch.bfloat16))
    layer(torch.randn(8, IN).to(torch.bfloat16))
    assert kernel_calls == [("wna16_matmul", 1), ("wna16_matmul", 8)]


def test_what_stays_on_the_reference_path(monkeypatch: pytest.MonkeyPatch) -> None:
    layer = _layer(ARGS[0])
    x = torch.randn(1, IN).to(torch.bfloat16)
    assert kernel_for(x, layer, ARGS[0]) is None  # CPU
    monkeypatch.setattr(dispatch, "on_kernel_device", lambda x: True)
    assert kernel_for(x, layer, ARGS[0]) is not None
    assert kernel_for(x.float(), layer, ARGS[0]) is None  # fp32 activations
    assert kernel_for(x.half(), layer, ARGS[0]) is None  # scales in another dtype than x
    odd = WeightQuantArgs(4, False, "group", 4)  # a group of half a word
    assert kernel_for(x, _layer(odd), odd) is None
    naive4 = WeightQuantArgs(4, True, "channel", layout="naive-quantized")  # int4 values one per int8
    assert kernel_for(x, _layer(naive4), naive4) is None
