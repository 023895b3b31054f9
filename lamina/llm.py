"""LLM: offline batched generation over the engine (vLLM's API)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Union

from tqdm.auto import tqdm

from lamina.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from lamina.engine.engine import LLMEngine
from lamina.engine.input_processor import PromptType
from lamina.loader.tokenizer import Tokenizer
from lamina.outputs import RequestOutput
from lamina.sampling_params import RequestOutputKind, SamplingParams

Messages = list[dict]


class LLM:
    """Load a local HF model directory and generate from batches of prompts.

        llm = LLM(model="path/to/model")
        llm = LLM(model="path/to/config.json", load_format="dummy", skip_tokenizer_init=True)  # random weights
        outputs = llm.generate(["def fib(n):"], SamplingParams(max_tokens=32, temperature=0))
    """

    def __init__(self, model: str, dtype: str = "auto", device: str = "auto", max_model_len: int | None = None,
                 block_size: int = 16, num_kv_blocks: int | None = None,
                 kv_cache_memory_bytes: int | None = None, max_num_batched_tokens: int | None = None,
                 max_num_seqs: int | None = None, enable_prefix_caching: bool = True, seed: int = 0,
                 skip_tokenizer_init: bool = False, tokenizer: str | None = None, max_logprobs: int = 20,
                 attention_backend: str = "auto", load_format: str = "auto",
                 gpu_memory_utilization: float = 0.9, enforce_eager: bool = False,
                 cuda_graph_max_batch_size: int = 256, async_scheduling: bool = True,
                 usage: str = "offline") -> None:
        """Engine arguments are vLLM's. max_num_seqs / max_num_batched_tokens None: chosen for the device
        and `usage` ("offline", or "serve" for the server), logged at start-up (lamina/engine/defaults.py)."""
        config = EngineConfig(
            model_config=ModelConfig(model=model, dtype=dtype, max_model_len=max_model_len, seed=seed,
                                     skip_tokenizer_init=skip_tokenizer_init, tokenizer=tokenizer,
                                     max_logprobs=max_logprobs, load_format=load_format),
            cache_config=CacheConfig(block_size=block_size, num_kv_blocks=num_kv_blocks,
                                     kv_cache_memory_bytes=kv_cache_memory_bytes,
                                     enable_prefix_caching=enable_prefix_caching,
                                     gpu_memory_utilization=gpu_memory_utilization),
            scheduler_config=SchedulerConfig(max_num_batched_tokens=max_num_batched_tokens,
                                             max_num_seqs=max_num_seqs),
            device=device, attention_backend=attention_backend, enforce_eager=enforce_eager,
            cuda_graph_max_batch_size=cuda_graph_max_batch_size, async_scheduling=async_scheduling)
        self.engine = LLMEngine(config, usage=usage)

    def get_tokenizer(self) -> Tokenizer | None:
        return self.engine.tokenizer

    def generate(self, prompts: PromptType | Sequence[PromptType],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in input order."""
        prompt_list = [prompts] if isinstance(prompts, (str, dict)) else list(prompts)
        params_list = self._params_for(prompt_list, sampling_params)
        request_ids = self._add_all(prompt_list, params_list)
        return self._run(request_ids, use_tqdm)

    def chat(self, messages: Union[Messages, Sequence[Messages]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             add_generation_prompt: bool = True, use_tqdm: bool = True) -> list[RequestOutput]:
        """Apply the model's chat template to one conversation (a list of messages) or a list of them."""
        tokenizer = self.engine.tokenizer
        if tokenizer is None:
            raise ValueError("chat: needs a tokenizer (skip_tokenizer_init=True was set)")
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = [tokenizer.apply_chat_template(c, add_generation_prompt=add_generation_prompt)
                   for c in conversations]
        # The template already holds any BOS token: encode without adding special tokens again.
        token_prompts = [{"prompt": p, "prompt_token_ids": tokenizer.encode(p, add_special_tokens=False)}
                         for p in prompts]
        return self.generate(token_prompts, sampling_params, use_tqdm)

    @staticmethod
    def _params_for(prompts: list, params: SamplingParams | Sequence[SamplingParams] | None,
                    ) -> list[SamplingParams]:
        """One SamplingParams per prompt, asking for FINAL_ONLY: only final outputs are read, so the
        engine builds no per-step ones. Copies: whatever output_kind the caller's objects say, they stay."""
        if params is None:
            params = SamplingParams()
        if isinstance(params, SamplingParams):
            return [params.with_output_kind(RequestOutputKind.FINAL_ONLY)] * len(prompts)
        params = list(params)
        if len(params) != len(prompts):
            raise ValueError(f"sampling_params: got {len(params)} for {len(prompts)} prompts; pass one, "
                             "or one per prompt")
        copies: dict[int, SamplingParams] = {}  # one copy per distinct object, however often it is repeated
        for p in params:
            if id(p) not in copies:
                copies[id(p)] = p.with_output_kind(RequestOutputKind.FINAL_ONLY)
        return [copies[id(p)] for p in params]

    def _add_all(self, prompts: list[PromptType], params: list[SamplingParams]) -> list[str]:
        added: list[str] = []
        try:
            for prompt, p in zip(prompts, params):
                added.append(self.engine.add_request(prompt, p))
        except ValueError as err:
            for request_id in added:  # all or nothing: no half-run batch
                self.engine.abort_request(request_id)
            raise ValueError(f"prompt {len(added)}: {err}") from err
        return added

    def _run(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        done: dict[str, RequestOutput] = {}
        with tqdm(total=len(request_ids), desc="generate", unit="req", disable=not use_tqdm) as bar:
            while self.engine.has_unfinished_requests():
                for output in self.engine.step():
                    if output.finished:
                        done[output.request_id] = output
                        bar.update(1)
        return [done[i] for i in request_ids]
