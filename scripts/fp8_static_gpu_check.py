"""llm-compressor's static FP8 scheme on the GPU (issue #13): a small random Llama (tests/helpers/tiny_models.py;
the demo model's checkpoints would not fit the device's upload) quantized by compressed-tensors (per-tensor fp8
weight scales; static per-tensor input scales from calibration, or dynamic per-token inputs), run by lamina on
CUDA (torch._scaled_mm) against transformers' float32 run of the same checkpoint on the CPU.

    python scripts/fp8_static_gpu_check.py --prepare DIR    # CPU: the checkpoints + transformers' log-probs
    python scripts/fp8_static_gpu_check.py --check DIR [--result-file F]   # GPU: lamina's log-probs vs those

The unquantized model's bf16 GPU run against transformers' float32 CPU run is the yardstick: the fp8 checkpoints
should sit about as close to transformers as bf16 itself does; a static scale read as a per-token one would not
(the CPU test tests/quant/test_fp8_static.py: the median moves by 1.3).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lamina import LLM, SamplingParams  # noqa: E402

PROMPTS = [[(11 * i + 3 * j + 1) % 250 for i in range(24 + 5 * j)] for j in range(6)]
KINDS = ("bf16-yardstick", "fp8-static", "fp8-dynamic")


def _input_amax(model: torch.nn.Module, prompts: list[list[int]]) -> dict[str, float]:
    amax: dict[str, float] = {}

    def hook(name: str):  # noqa: ANN202
        def record(_module, args) -> None:  # noqa: ANN001
            amax[name] = max(amax.get(name, 0.0), args[0].abs().max().item())
        return record

    handles = [m.register_forward_pre_hook(hook(n)) for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and "lm_head" not in n]
    with torch.no_grad():
        for ids in prompts:
            model(torch.tensor([ids]))
    for handle in handles:
        handle.remove()
    return amax


def prepare(directory: Path) -> None:
    from tests.helpers.fp8_checkpoints import fp8_per_tensor_checkpoint
    from tests.helpers.hf_oracle import hf_prompt_logprobs, load_hf
    from tests.helpers.tiny_models import make_tiny_model

    source, prompts = directory / "bf16-yardstick", PROMPTS
    make_tiny_model("llama", source, vocab_size=256, hidden_size=128, head_dim=32, initializer_range=0.2)
    amax = _input_amax(load_hf(str(source)), prompts)
    reference = {"prompts": prompts, "bf16-yardstick": hf_prompt_logprobs(str(source), prompts)}
    for kind, scale in (("fp8-static", lambda name: amax[name] / 448), ("fp8-dynamic", None)):
        fp8_per_tensor_checkpoint(source, directory / kind, scale)
        reference[kind] = hf_prompt_logprobs(str(directory / kind), prompts)
    (directory / "reference.json").write_text(json.dumps(reference))
    print(f"wrote {directory}: {', '.join(KINDS)} and reference.json")


def _lamina_logprobs(model_dir: str, prompts: list[list[int]], device: str) -> list[list[float]]:
    llm = LLM(model=model_dir, device=device, dtype="bfloat16" if device == "cuda" else "float32",
              skip_tokenizer_init=True)
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    outs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params, use_tqdm=False)
    llm.engine.check_integrity()
    return [[next(iter(entry.values())).logprob for entry in o.prompt_logprobs[1:]] for o in outs]


def check(directory: Path, device: str) -> dict:
    reference = json.loads((directory / "reference.json").read_text())
    prompts = reference["prompts"]
    rows = {}
    for kind in KINDS:
        ours = _lamina_logprobs(str(directory / kind), prompts, device)
        diffs = sorted(abs(a - b) for ra, rb in zip(ours, reference[kind]) for a, b in zip(ra, rb))
        rows[kind] = dict(positions=len(diffs), median=diffs[len(diffs) // 2], p90=diffs[int(0.9 * len(diffs))],
                          max=diffs[-1], mean=statistics.fmean(diffs))
    return dict(device=torch.cuda.get_device_name() if device == "cuda" else device, rows=rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prepare", type=Path)
    parser.add_argument("--check", type=Path)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--result-file", type=Path)
    args = parser.parse_args()
    if args.prepare:
        args.prepare.mkdir(parents=True, exist_ok=True)
        prepare(args.prepare)
    if args.check:
        report = check(args.check, args.device)
        print(f"|d logprob| against transformers (float32, CPU) on {report['device']}:")
        for kind, row in report["rows"].items():
            print(f"  {kind:15s} median {row['median']:.2e}  p90 {row['p90']:.2e}  max {row['max']:.2e}  "
                  f"({row['positions']} positions)")
        if args.result_file:
            args.result_file.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
