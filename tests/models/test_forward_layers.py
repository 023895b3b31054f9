"""CausalLM.forward_layers: the first L' decoder layers + the final norm, against HF truncated to L' layers."""
from __future__ import annotations

import copy

import pytest
import torch

from lamina.attention.metadata import set_attention_metadata
from lamina.loader.hf_config import load_model_arch
from lamina.loader.model_loader import load_model
from tests.helpers.hf_oracle import load_hf
from tests.helpers.paged import PagedRunner, build_metadata
from tests.helpers.tiny_models import make_tiny_model


def truncated_hf(hf: torch.nn.Module, num_layers: int) -> torch.nn.Module:
    """A copy of an HF causal LM keeping only its first `num_layers` decoder layers (then norm and LM head)."""
    short = copy.deepcopy(hf)
    short.model.layers = short.model.layers[:num_layers]
    short.config.num_hidden_layers = num_layers
    return short.eval()


@pytest.mark.parametrize("num_layers", [1, 2, 3])
def test_forward_layers_matches_truncated_hf(tmp_path, num_layers: int) -> None:
    path = str(make_tiny_model("qwen3", tmp_path / "m", num_hidden_layers=3))
    arch = load_model_arch(path)
    model = load_model(path, arch, torch.float32, "cpu")
    PagedRunner(model, arch, block_size=4, num_blocks=8)  # binds a KV cache
    prompt = torch.randint(0, 256, (11,), generator=torch.Generator().manual_seed(0))
    with set_attention_metadata(build_metadata([([1, 2, 3], 0, 11)], 4)), torch.inference_mode():
        hidden = model.forward_layers(prompt, torch.arange(11), num_layers)
        logits = model.compute_logits(hidden)
        full = model(prompt, torch.arange(11)) if num_layers == 3 else None
    with torch.no_grad():
        expected = truncated_hf(load_hf(path), num_layers)(prompt[None]).logits[0]
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=0)
    if full is not None:  # all layers: exactly `forward`
        torch.testing.assert_close(hidden, full, atol=0, rtol=0)
