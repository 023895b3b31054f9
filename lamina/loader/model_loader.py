"""Build a model from its ModelArch and fill it: strictly from the checkpoint, or with dummy weights."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from lamina.attention.backends import get_attention_backend
from lamina.config import LOAD_FORMATS, KernelChoice, ModelArch
from lamina.device import MODEL_DTYPES
from lamina.distributed.parallel_state import current_group
from lamina.loader.weights import iterate_weight_slices, iterate_weights
from lamina.models.common import CausalLM
from lamina.models.names import format_names
from lamina.models.registry import get_model_class
from lamina.quant.config import parse_quant_config

_DUMMY_STD = 0.02


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    # Parameters are created with torch.empty/ones in the default dtype: build them in `dtype`
    # directly instead of building float32 and casting (twice the memory at load time).
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _check_args(dtype: torch.dtype, load_format: str) -> None:
    if dtype not in MODEL_DTYPES:
        raise ValueError(f"dtype must be one of {[str(d) for d in MODEL_DTYPES]}, got {dtype}")
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format must be one of {list(LOAD_FORMATS)}, got {load_format!r}")


def load_model(model_dir: str, arch: ModelArch, dtype: torch.dtype, device: torch.device | str,
               load_format: str = "auto", attention_backend: str = "auto",
               kernels: KernelChoice = KernelChoice()) -> CausalLM:
    """Instantiate `arch.architecture` in `dtype` on `device` and load its weights.

    kernels: which optional Triton kernels the model's layers may run (lamina.layers.dispatch); the
    default allows all of them, off means the PyTorch / cuBLAS path everywhere.

    load_format "auto": the safetensors checkpoint in `model_dir`, strictly: a checkpoint tensor
    that matches no parameter, or a parameter with no checkpoint tensor, is a ValueError naming them.
    load_format "dummy": small random weights, no files read (for benchmarks and tests).
    A quantized checkpoint (config.json's quantization_config, lamina/quant/) builds quantized layers.
    Inside lamina.distributed.parallel_state.building(group) the model is this rank's shard of it.
    """
    _check_args(dtype, load_format)
    model_cls = get_model_class(arch.architecture)
    backend = get_attention_backend(attention_backend, pdl=kernels.pdl)
    quant_config = parse_quant_config(arch.raw.get("quantization_config"))
    with _default_dtype(dtype), torch.device(device):
        model = model_cls(arch, backend, kernels, quant_config)
    if load_format == "dummy":
        init_dummy_weights(model)
    else:
        load_checkpoint(model, model_dir)
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if method is not None:
            try:
                method.process_after_loading(module)
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
    release_weight_loaders(model)
    return model.eval()


def release_weight_loaders(model: torch.nn.Module) -> None:
    """Drop every parameter's `weight_loader` once the weights are in. A loader is a bound method of the
    parameter's own layer (or a partial over it): layer -> parameter -> loader -> layer is a reference cycle, and
    the engine freezes the heap after start-up (lamina.engine.engine.freeze_heap), whose cycles are never
    collected: a dropped engine kept every layer's weights (on the GPU too) for the life of the process."""
    for param in model.parameters():
        param.__dict__.pop("weight_loader", None)


def load_checkpoint(model: CausalLM, model_dir: str) -> None:
    """Stream the checkpoint into `model`; every expected tensor must be present, and nothing else.
    A model built for tensor parallelism (inside parallel_state.building) reads only its rank's slices."""
    weights = iterate_weight_slices(model_dir) if current_group().is_parallel else iterate_weights(model_dir)
    loaded = model.load_weights(weights)
    missing = model.expected_weight_names() - loaded
    if missing:
        raise ValueError(f"checkpoint in {model_dir!r} is missing {len(missing)} tensor(s) that "
                         f"{type(model).__name__} needs: {format_names(missing)}")


@torch.no_grad()
def init_dummy_weights(model: CausalLM, seed: int = 0) -> None:
    """Norm weights 1, everything else N(0, 0.02): finite, deterministic activations without a checkpoint.

    Quantized layers (a quant method with `args`: W4A16 / W8A16 / W8A8 int8 / FP8) get valid random values
    instead: packed words of uniform random bits, int8 values and zero points uniform in the num_bits range,
    fp8 weights of std ~74 (as int8's), positive scales that make the dequantized weight's std about 0.02,
    each shard's weight_shape. Other integer parameters stay zero."""
    generator = None
    int_params = _quantized_params(model)
    for name, param in model.named_parameters():
        if generator is None:
            generator = torch.Generator(device=param.device).manual_seed(seed)
        if name in int_params:
            _init_quantized(param, name.rpartition(".")[2], *int_params[name], generator)
        elif not param.is_floating_point():
            param.zero_()
        elif name.endswith("norm.weight"):
            param.fill_(1.0)
        else:
            param.normal_(0.0, _DUMMY_STD, generator=generator)


def _quantized_params(model: CausalLM) -> dict[str, tuple[int, torch.nn.Module]]:
    """Parameter name -> (num_bits, its module) for every parameter of a quantized layer (int or fp8)."""
    found = {}
    for prefix, module in model.named_modules():
        args = getattr(getattr(module, "quant_method", None), "args", None)
        if args is None or getattr(args, "type", "int") not in ("int", "float") or not isinstance(args.num_bits, int):
            continue
        for name, _ in module.named_parameters(recurse=False):
            found[f"{prefix}.{name}" if prefix else name] = (args.num_bits, module)
    return found


def _init_quantized(param: torch.Tensor, leaf: str, num_bits: int, module: torch.nn.Module,
                    generator: torch.Generator) -> None:
    lo, hi = -(1 << (num_bits - 1)), (1 << (num_bits - 1)) - 1
    if leaf == "weight_packed":  # int32 words of uniform random bits: uniform values, every field valid
        param.copy_(torch.randint(-(1 << 31), 1 << 31, param.shape, generator=generator, device=param.device,
                                  dtype=torch.int64).to(param.dtype))
    elif param.is_floating_point() and param.element_size() == 1:  # fp8 values, spread as int8's
        std_q = (1 << num_bits) / 12 ** 0.5
        param.copy_((torch.randn(param.shape, generator=generator, device=param.device) * std_q).clamp(-448, 448))
    elif leaf == "weight_shape":
        sizes = getattr(module.quant_method, "output_sizes", None)
        if sizes is not None and len(sizes) == param.shape[0]:
            param.copy_(torch.tensor([[n, module.quant_method.input_size] for n in sizes], dtype=param.dtype))
    elif not param.is_floating_point():  # int8 values (naive layout) and zero points
        param.copy_(torch.randint(lo, hi + 1, param.shape, generator=generator, device=param.device,
                                  dtype=torch.int64).to(param.dtype))
    elif leaf == "weight_scale":  # (q - z) spans ~2^b values: std ~ 2^b / sqrt(12)
        std_q = (1 << num_bits) / 12 ** 0.5
        param.uniform_(0.5 * _DUMMY_STD / std_q, 1.5 * _DUMMY_STD / std_q, generator=generator)
    else:
        param.normal_(0.0, _DUMMY_STD, generator=generator)
