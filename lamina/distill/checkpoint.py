"""Loading the teacher, building the student and writing HF checkpoints (via `transformers`)."""
from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import torch

from .data import TokenData

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:  # transformers is the optional `lamina[train]` extra
        raise ImportError("lamina distill needs `transformers`: pip install 'lamina[train]'") from exc
    return transformers


def load_teacher(path: str | Path, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """Load an HF causal LM from a directory, frozen, in eval mode."""
    root = Path(path)
    if not (root / "config.json").is_file():
        raise ValueError(f"teacher: {root} is not a model directory (no config.json)")
    model = _transformers().AutoModelForCausalLM.from_pretrained(root, dtype=dtype)
    model.to(device).eval().requires_grad_(False)
    return model


def teacher_and_data(args: Any, device: torch.device, method: str, positive: tuple[str, ...]
                     ) -> tuple[TokenData, torch.nn.Module]:
    """What head training (--method medusa / eagle) starts from: the options named in `positive` checked to be
    >= 1, the token data, and the frozen teacher (bf16 on CUDA, float32 elsewhere) whose vocabulary holds the
    data's."""
    for name in positive:
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1 with --method {method}, "
                             f"got {getattr(args, name)}")
    data = TokenData.load(args.data)
    teacher = load_teacher(args.teacher, device, torch.bfloat16 if device.type == "cuda" else torch.float32)
    vocab = teacher.get_output_embeddings().weight.shape[0]
    if data.vocab_size > vocab:
        raise ValueError(f"data: vocab_size {data.vocab_size} exceeds the teacher's {vocab}")
    return data, teacher


def student_config_dict(spec: str | Path) -> dict[str, Any]:
    """Read a student config: a JSON file of config fields, or a model directory holding config.json."""
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ValueError(f"student-config: {spec} is neither a JSON file nor a directory with config.json")
    fields = json.loads(path.read_text())
    if not isinstance(fields, dict):
        raise ValueError(f"student-config: {path} must hold a JSON object of config fields")
    return fields


def build_model(fields: dict[str, Any], vocab_size: int, seed: int) -> torch.nn.Module:
    """Build a randomly initialised causal LM (default architecture: llama) in fp32.

    ``vocab_size`` (the teacher's or the data's) fills the field when absent and must match when given.
    """
    tf = _transformers()
    fields = dict(fields)
    fields.pop("architectures", None)
    model_type = fields.pop("model_type", "llama")
    given = fields.setdefault("vocab_size", vocab_size)
    if given != vocab_size:
        raise ValueError(f"student-config: vocab_size {given} must equal the teacher's / data's {vocab_size}")
    config = tf.AutoConfig.for_model(model_type, **fields)
    torch.manual_seed(seed)
    return tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def count_parameters(model: torch.nn.Module) -> int:
    """Unique parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def save_checkpoint(
    model: torch.nn.Module, out_dir: str | Path, tokenizer_dir: str | Path | None,
    eos_token_ids: list[int] | None = None,
) -> None:
    """Write ``config.json``, ``model.safetensors`` (bf16), ``generation_config.json`` and tokenizer files.

    ``generation_config.json`` is copied from ``tokenizer_dir`` (the teacher) when it has one, else built
    from ``eos_token_ids``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    bf16 = copy.deepcopy(model).to(device="cpu", dtype=torch.bfloat16)
    bf16.save_pretrained(out, safe_serialization=True)
    src = Path(tokenizer_dir) if tokenizer_dir is not None else None
    if src is not None:
        for name in TOKENIZER_FILES:
            if (src / name).is_file():
                shutil.copyfile(src / name, out / name)
    if src is not None and (src / "generation_config.json").is_file():
        shutil.copyfile(src / "generation_config.json", out / "generation_config.json")
    elif eos_token_ids is not None:
        write_generation_config(out, eos_token_ids, pad_token_id=eos_token_ids[0])


def write_generation_config(out_dir: str | Path, eos_token_ids: list[int], pad_token_id: int) -> None:
    """A minimal ``generation_config.json``: greedy by default, stop on any of ``eos_token_ids``."""
    gen = {"eos_token_id": list(eos_token_ids), "pad_token_id": pad_token_id, "do_sample": False}
    Path(out_dir, "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
