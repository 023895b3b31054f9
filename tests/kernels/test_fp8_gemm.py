"""lamina.kernels.fp8_gemm against lamina.quant.w8a8's fp8 reference (float32 products of the same e4m3 values,
scaled), under the interpreter: both orientations (swap), M, N and K off the tiles, a static scale; operands and
table files that do not fit, named; the measured table's lookup; and fp8_matmul's routing to the kernel where a
table names a config and KernelChoice allows it (dispatch patched to the kernel device)."""
from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("triton")

from lamina.config import KernelChoice  # noqa: E402
from lamina.kernels import fp8_gemm  # noqa: E402
from lamina.kernels.fp8_gemm import Fp8GemmConfig  # noqa: E402
from lamina.layers import dispatch  # noqa: E402
from lamina.quant import fp8, w8a8  # noqa: E402

CONFIGS = [Fp8GemmConfig(16, 16, 32), Fp8GemmConfig(32, 16, 64, num_stages=2),
           Fp8GemmConfig(16, 32, 32, swap=True), Fp8GemmConfig(16, 16, 128, swap=True)]
SHAPES = [(1, 48, 96), (5, 40, 64), (33, 24, 160), (16, 16, 32)]  # (M, N, K)


def _operands(m: int, n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x_q, x_scale = w8a8.per_token_fp8_reference(torch.randn(m, k, generator=g) * 3)
    w = fp8.fp8_quantize(torch.randn(n, k, generator=g) * torch.rand(n, 1, generator=g), fp8.weight_args(0),
                         torch.float32)
    return x_q, x_scale, w.q, w.scale


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("m, n, k", SHAPES)
def test_equals_the_reference(config: Fp8GemmConfig, m: int, n: int, k: int) -> None:
    x_q, x_scale, w_q, w_scale = _operands(m, n, k)
    out = fp8_gemm.fp8_gemm(x_q, x_scale, w_q, w_scale, torch.float32, config)
    ref = w8a8.fp8_reference(x_q, x_scale, w_q, w_scale, torch.float32)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    bf16 = fp8_gemm.fp8_gemm(x_q, x_scale, w_q, w_scale, torch.bfloat16, config)
    assert bf16.dtype == torch.bfloat16  # one rounding of the fp32 result, at the end: within one bf16 ulp of it
    assert ((bf16.float() - out).abs() <= 2 ** -7 * out.abs()).all()


def test_zero_rows() -> None:
    x_q, x_scale, w_q, w_scale = _operands(1, 24, 32)
    assert fp8_gemm.fp8_gemm(x_q[:0], x_scale[:0], w_q, w_scale, torch.bfloat16, CONFIGS[0]).shape == (0, 24)


def test_a_config_names_its_bad_field() -> None:
    with pytest.raises(ValueError, match="block_m: a power of two >= 16"):
        Fp8GemmConfig(8, 64)
    with pytest.raises(ValueError, match="block_k"):
        Fp8GemmConfig(16, 64, 96)


def test_the_table_picks_the_first_bucket_holding_m() -> None:
    cfg = Fp8GemmConfig(16, 64, 128, swap=True)
    table = {"64x32": [(16, cfg), (64, None), (128, Fp8GemmConfig(128, 32))]}
    assert fp8_gemm.config_for(1, 64, 32, table) == cfg and fp8_gemm.config_for(16, 64, 32, table) == cfg
    assert fp8_gemm.config_for(17, 64, 32, table) is None  # the peer measured faster there
    assert fp8_gemm.config_for(100, 64, 32, table) == Fp8GemmConfig(128, 32)
    assert fp8_gemm.config_for(129, 64, 32, table) is None  # past the table: the peer
    assert fp8_gemm.config_for(1, 64, 48, table) is None  # a shape never measured: the peer
    assert fp8_gemm.parse_table(json.loads(json.dumps(fp8_gemm.table_json(table)))) == table


def test_the_shipped_table_parses(tmp_path) -> None:  # noqa: ANN001 - pytest fixture
    assert fp8_gemm.device_table("no such device") == {}
    assert fp8_gemm.device_table("x", tmp_path / "missing.json") == {}
    if fp8_gemm.TABLE_PATH.exists():
        for name in json.loads(fp8_gemm.TABLE_PATH.read_text()):
            for buckets in fp8_gemm.device_table(name).values():
                rows = [r for r, _ in buckets]
                assert rows == sorted(rows) and all(r >= 1 for r in rows)


def test_fp8_matmul_routes_to_the_kernel_where_the_table_says(monkeypatch: pytest.MonkeyPatch) -> None:
    x_q, x_scale, w_q, w_scale = _operands(3, 48, 96)
    ref = w8a8.fp8_reference(x_q, x_scale, w_q, w_scale, torch.bfloat16)
    calls = []
    original = fp8_gemm.fp8_gemm
    monkeypatch.setattr(dispatch, "on_kernel_device", lambda x: True)
    monkeypatch.setattr(fp8_gemm, "fp8_gemm", lambda *a: calls.append(a[-1]) or original(*a))
    monkeypatch.setattr(fp8_gemm, "device_table", lambda name: {"48x96": [(4, CONFIGS[2])]} if name == "cpu" else {})
    out = w8a8.fp8_matmul(x_q, x_scale, w_q, w_scale, torch.bfloat16)
    assert calls == [CONFIGS[2]] and (out.float() - ref.float()).abs().max() <= 2 ** -7 * ref.float().abs().max()
    x5, s5, _, _ = _operands(5, 48, 96)
    w8a8.fp8_matmul(x5, s5, w_q, w_scale, torch.bfloat16)  # 5 rows: past the table, the reference path here
    w8a8.fp8_matmul(x_q, x_scale, w_q, w_scale, torch.bfloat16, KernelChoice(gemv=False))  # decode kernels off
    assert calls == [CONFIGS[2]]


def test_one_static_scale_expanded_over_the_rows() -> None:
    x_q, _, w_q, w_scale = _operands(5, 40, 64)
    static = torch.tensor([[0.05]]).expand(5, 1)  # as lamina.quant.fp8.static_fp8 passes it: stride 0
    out = fp8_gemm.fp8_gemm(x_q, static, w_q, w_scale, torch.float32, CONFIGS[2])
    ref = w8a8.fp8_reference(x_q, static, w_q, w_scale, torch.float32)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())


def test_operands_that_do_not_fit_name_themselves() -> None:
    x_q, x_scale, w_q, w_scale = _operands(3, 24, 32)
    cfg = CONFIGS[0]
    with pytest.raises(ValueError, match="x_q must be a 2-D float8_e4m3fn"):
        fp8_gemm.fp8_gemm(x_q.float(), x_scale, w_q, w_scale, torch.bfloat16, cfg)
    with pytest.raises(ValueError, match="must share K"):
        fp8_gemm.fp8_gemm(x_q[:, :16], x_scale, w_q, w_scale, torch.bfloat16, cfg)
    with pytest.raises(ValueError, match=r"w_scale must be \[24, 1\]"):
        fp8_gemm.fp8_gemm(x_q, x_scale, w_q, w_scale[:5], torch.bfloat16, cfg)


@pytest.mark.parametrize("entries, match", [
    ({"64x32": [[16, None], [8, None]]}, "strictly ascending"),
    ({"64x32": [[0, None]]}, "strictly ascending from 1"),
    ({"64by32": [[1, None]]}, "expected \"NxK\""),
    ({"64x32": [[1, {"block_m": 16, "block_n": 64, "tile": 3}]]}, "config fields"),
    ({"64x32": [[1, {"block_m": 8, "block_n": 64}]]}, "block_m: a power of two"),
])
def test_a_bad_table_names_where_and_what(entries: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match) as err:
        fp8_gemm.parse_table(entries, "configs/fp8_gemm.json, device 'X'")
    assert "configs/fp8_gemm.json, device 'X'" in str(err.value) and "64" in str(err.value)


def test_a_table_file_that_is_not_json_names_its_path(tmp_path) -> None:  # noqa: ANN001 - pytest fixture
    path = tmp_path / "fp8_gemm.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="fp8_gemm.json: not valid JSON"):
        fp8_gemm.device_table("NVIDIA H200", path)
