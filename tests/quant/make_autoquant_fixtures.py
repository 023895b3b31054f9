"""Make tests/quant/data/autoquant/: AutoGPTQ and AutoAWQ GEMM checkpoints of a tiny Llama, packed by the tools' own
code called as a library (neither installs on this CPU-only machine: both need their CUDA extensions or their
model stacks), each with `reference.safetensors`, every linear's weight as the tool's own dequantization gives it.

    gptq          AutoGPTQ QuantLinear.pack (auto_gptq/nn_modules/qlinear/qlinear_cuda.py), 4-bit, group 32, sym false
    gptq_actorder the same with desc_act: a random g_idx (each group a random set of 32 input columns)
    awq           AutoAWQ WQLinear_GEMM.from_linear (awq/modules/linear/gemm.py), 4-bit, group 32, GEMM
    reference     AutoGPTQ: QuantLinear.forward of the identity (its torch path); AutoAWQ:
                  awq.utils.packing_utils.dequantize_gemm; both in float32 on the checkpoint's fp16 scales

The integers come from round-to-nearest on the float weights (the tools' packers take scales and zeros as
computed by their quantizers; the algorithm that picks them does not change the format).

    python3 tests/quant/make_autoquant_fixtures.py GPTQ_QLINEAR_CUDA_PY AUTOAWQ_SOURCE_DIR
(AutoGPTQ 9f7d370 and AutoAWQ 0.2.9's sdist made the committed files.)
"""
from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import types
import zlib
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tests.helpers.tiny_models import make_tiny_model

OUT = Path(__file__).parent / "data" / "autoquant"
GROUP = 32
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SAME_INPUT = {"k_proj": "q_proj", "v_proj": "q_proj", "up_proj": "gate_proj"}  # one Hessian, one act order


def _load_file(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_awq(src: Path) -> tuple[type, object]:
    """(WQLinear_GEMM, dequantize_gemm) from an AutoAWQ source tree, without its package __init__ (models, CUDA)."""
    for name in ("awq", "awq.utils", "awq.modules", "awq.modules.linear"):
        sys.modules.setdefault(name, types.ModuleType(name))
    utils = types.ModuleType("awq.utils.utils")
    utils.get_best_device = lambda: "cpu"  # the real module imports accelerate for this one function
    sys.modules["awq.utils.utils"] = utils
    _load_file("awq.utils.module", src / "awq/utils/module.py")
    packing = _load_file("awq.utils.packing_utils", src / "awq/utils/packing_utils.py")
    gemm = _load_file("awq.modules.linear.gemm", src / "awq/modules/linear/gemm.py")
    return gemm.WQLinear_GEMM, packing.dequantize_gemm


def rtn(weight: torch.Tensor, g_idx: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(fake-quantized weight [out, in], scales [out, groups] fp16 values, zeros [out, groups]): 4-bit asymmetric
    round to nearest over each group's columns (group g = the columns with g_idx == g)."""
    out_features = weight.shape[0]
    scales, zeros = torch.empty(out_features, groups), torch.empty(out_features, groups)
    fake = torch.empty_like(weight)
    for g in range(groups):
        cols = (g_idx == g).nonzero().flatten()
        w = weight[:, cols]
        low, high = w.amin(1).clamp(max=0), w.amax(1).clamp(min=0)
        scale = ((high - low) / 15).clamp(min=1e-5).half().float()
        zero = torch.round(-low / scale).clamp(0, 15)
        q = torch.clamp(torch.round(w / scale[:, None]) + zero[:, None], 0, 15)
        fake[:, cols] = (q - zero[:, None]) * scale[:, None]
        scales[:, g], zeros[:, g] = scale, zero
    return fake, scales, zeros


def gptq_linear(qlinear_cls: type, weight: torch.Tensor, g_idx: torch.Tensor) -> tuple[dict, torch.Tensor]:
    out_features, in_features = weight.shape
    fake, scales, zeros = rtn(weight, g_idx, in_features // GROUP)
    linear = torch.nn.Linear(in_features, out_features, bias=False)
    linear.weight.data = fake
    q = qlinear_cls(4, GROUP, in_features, out_features, False, weight_dtype=torch.float32)
    q.pack(linear, scales, zeros.clone(), g_idx.to(torch.int32))
    reference = q(torch.eye(in_features)).t().contiguous()  # its torch path: scales[g_idx] * (q - zeros)
    tensors = {"qweight": q.qweight, "qzeros": q.qzeros, "scales": q.scales.half(), "g_idx": q.g_idx.to(torch.int32)}
    return tensors, reference


def awq_linear(wq_cls: type, dequantize: object, weight: torch.Tensor) -> tuple[dict, torch.Tensor]:
    out_features, in_features = weight.shape
    fake, scales, zeros = rtn(weight, torch.arange(in_features) // GROUP, in_features // GROUP)
    linear = torch.nn.Linear(in_features, out_features, bias=False)
    linear.weight.data = fake
    q = wq_cls.from_linear(linear, 4, GROUP, scales=scales.t().contiguous(), zeros=zeros.t().contiguous())
    reference = dequantize(q.qweight, q.qzeros, q.scales.float(), 4, GROUP).t().contiguous()
    return {"qweight": q.qweight, "qzeros": q.qzeros, "scales": q.scales.half()}, reference


def make(name: str, gptq_src: Path, awq_src: Path, out: Path, base: Path) -> Path:
    qlinear_cls = _load_file("qlinear_cuda", gptq_src).QuantLinear
    wq_cls, dequantize = load_awq(awq_src)
    tensors, reference = {}, {}
    for key, value in load_file(str(base / "model.safetensors")).items():
        module, _, leaf = key.rpartition(".")
        if module.rpartition(".")[2] not in LINEARS:
            tensors[key] = value
            continue
        if name == "awq":
            packed, ref = awq_linear(wq_cls, dequantize, value)
        else:
            in_features = value.shape[1]
            g_idx = torch.arange(in_features) // GROUP
            if name == "gptq_actorder":  # linears reading the same input share their order, as in GPTQ
                leaf = module.rpartition(".")[2]
                order_key = module.rpartition(".")[0] + SAME_INPUT.get(leaf, leaf)
                generator = torch.Generator().manual_seed(zlib.crc32(order_key.encode()))
                g_idx = g_idx[torch.randperm(in_features, generator=generator)]
            packed, ref = gptq_linear(qlinear_cls, value, g_idx)
        tensors.update({f"{module}.{k}": v.contiguous() for k, v in packed.items()})
        reference[key] = ref
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"))
    save_file(reference, str(out / "reference.safetensors"))
    config = json.loads((base / "config.json").read_text())
    config["quantization_config"] = (
        {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True, "version": "gemm"}
        if name == "awq" else
        {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": name == "gptq_actorder",
         "sym": False, "checkpoint_format": "gptq", "true_sequential": True})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def main() -> None:
    gptq_src, awq_src = Path(sys.argv[1]), Path(sys.argv[2])
    base = make_tiny_model("llama", OUT / "_base")
    for name in ("gptq", "gptq_actorder", "awq"):
        make(name, gptq_src, awq_src, OUT / name, base)
    shutil.rmtree(base)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
