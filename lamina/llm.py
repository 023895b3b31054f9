"""LLM: offline batched generation over the engine (vLLM's API)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Union

from tqdm.auto import tqdm

from lamina.config import engine_config
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
        llm = LLM(model="path/to/model", tensor_parallel_size=2)  # split over 2 GPUs (docs/distributed.md)
        outputs = llm.generate(["def fib(n):"], SamplingParams(max_tokens=32, temperature=0))
    """

    def __init__(self, model: str, *, usage: str = "offline", **engine_args: Any) -> None:
        """Engine arguments are vLLM's, as keywords: every field of ModelConfig, CacheConfig, SchedulerConfig
        and EngineConfig (lamina/config.py), routed there by `engine_config`; an unknown name is a TypeError
        listing the allowed ones. max_num_seqs / max_num_batched_tokens None: chosen for the device and
        `usage` ("offline", or "serve" for the server), logged at start-up (lamina/engine/defaults.py)."""
        self.engine = LLMEngine(engine_config(model=model, **engine_args), usage=usage)

    def shutdown(self) -> None:
        """Stop the engine's worker processes (tensor_parallel_size > 1) and leave torch.distributed; idempotent.
        Without it they stop when this process exits."""
        self.engine.executor.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

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
