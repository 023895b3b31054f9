"""Hypothesis strategies for the server fuzz (`python -m lamina.bench.fuzz`): valid, near-valid, hostile bodies.

A case is bytes on the wire, so it can hold what json.dumps will not write: NaN and Infinity (Python's json
reads them), integers of thousands of digits, lone UTF-16 surrogates as JSON escapes, nesting thousands
deep, truncated JSON, bytes that are not UTF-8.

    kind        body                                                  the server must answer
    valid       a completions / chat body within every limit          200 (or 429 when busy)
    cancelled   a valid body, longer; the client leaves after a while  (nothing: the request is aborted)
    mutated     a valid body with 1-3 fields set to hostile values    < 500; with one field, a 400 / 404 names it
    chaos       an object of random keys and values                   < 500
    malformed   empty, truncated, not JSON, not an object, too large  < 500 (400 / 413)
    other       GET /v1/models, /health, /metrics, wrong methods, unknown paths
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

INT64 = 2**63
UNSUPPORTED_SET = {"response_format": {"type": "json_object"}, "tools": [{"type": "function"}], "tool_choice": "auto",
                   "logit_bias": {"5": 10}, "guided_json": {"type": "object"}, "guided_regex": "a+",
                   "guided_foo": 1, "prompt_logprobs": 1, "use_beam_search": True, "chat_template": "{{ 1 }}",
                   "structured_outputs": {"json": {}}, "bad_words": ["a"], "allowed_token_ids": [1]}
UNSUPPORTED_OFF = {"response_format": {"type": "text"}, "tools": [], "tool_choice": "none", "logit_bias": {},
                   "guided_json": None, "use_beam_search": False, "spaces_between_special_tokens": True}


class Raw(str):
    """JSON text written as is (NaN, 1e999, a 5,000-digit integer, deep nesting)."""


@dataclass(frozen=True)
class FuzzTarget:
    """What the generated requests are aimed at (the server's limits)."""

    model_name: str
    vocab_size: int
    max_model_len: int
    max_n: int = 4
    max_logprobs: int = 20
    max_body_bytes: int = 64 * 1024
    max_tokens: int = 4  # the most tokens a valid case asks for (cancelled cases ask for more)


@dataclass(frozen=True)
class FuzzCase:
    kind: str
    method: str
    path: str
    body: bytes = b""
    content_type: str | None = "application/json"
    field: str | None = None  # a mutated case: a 400 or 404 must name this field (`param`)
    stream: bool = False
    cancel_after: float | None = None  # seconds after which the client disconnects


def to_json(value: object) -> str:
    """JSON text; strings as ASCII escapes (a lone surrogate becomes its \\udXXX escape), Raw as is."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{to_json(str(k))}:{to_json(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(to_json(v) for v in value) + "]"
    return json.dumps(value)


# ---- valid bodies -----------------------------------------------------------------------------------

_valid_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=16)
_surrogate = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
_hostile_text = st.one_of(st.text(max_size=12), st.tuples(st.text(max_size=4), _surrogate).map("".join),
                          st.sampled_from(["", "\x00", "\ufeff", "\U0010ffff", "\ud83d\ude00", "a" * 3000]))


def _token_ids(target: FuzzTarget) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, target.vocab_size - 1), min_size=1, max_size=12)


def _sampling(target: FuzzTarget, max_tokens: st.SearchStrategy[int]) -> st.SearchStrategy[dict]:
    optional = {"temperature": st.sampled_from([0, 0.0, 0.5, 1, 2.0]), "top_p": st.floats(0.05, 1.0),
                "top_k": st.sampled_from([-1, 0, 1, 5, 50]), "min_p": st.floats(0, 0.5),
                "seed": st.integers(-INT64, INT64 - 1), "n": st.integers(1, target.max_n),
                "stop": st.one_of(_valid_text, st.lists(_valid_text, max_size=4)),
                "frequency_penalty": st.floats(-2, 2), "presence_penalty": st.floats(-2, 2),
                "repetition_penalty": st.floats(0.5, 2), "ignore_eos": st.booleans(),
                "stop_token_ids": st.lists(st.integers(0, target.vocab_size - 1), max_size=4),
                "include_stop_str_in_output": st.booleans(), "skip_special_tokens": st.booleans(),
                "stream": st.booleans(), "stream_options": st.just({"include_usage": True}),
                "user": _valid_text, "model": st.sampled_from([target.model_name, None])}
    return st.fixed_dictionaries({"max_tokens": max_tokens}, optional=optional)


def _completion(target: FuzzTarget, max_tokens: st.SearchStrategy[int]) -> st.SearchStrategy[dict]:
    ids = _token_ids(target)
    prompt = st.one_of(_valid_text, st.lists(_valid_text, min_size=1, max_size=3), ids,
                       st.lists(ids, min_size=1, max_size=2))
    extra = st.fixed_dictionaries({"prompt": prompt}, optional={"logprobs": st.integers(0, 5), "echo": st.just(False)})
    return st.tuples(_sampling(target, max_tokens), extra).map(lambda d: {**d[0], **d[1]})


def _message() -> st.SearchStrategy[dict]:
    parts = st.lists(st.builds(lambda t: {"type": "text", "text": t}, _valid_text), min_size=1, max_size=2)
    return st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]),
                                  "content": st.one_of(_valid_text, parts)})


def _chat(target: FuzzTarget, max_tokens: st.SearchStrategy[int]) -> st.SearchStrategy[dict]:
    messages = st.tuples(st.lists(_message(), max_size=2), _valid_text).map(
        lambda m: [*m[0], {"role": "user", "content": m[1]}])
    extra = st.fixed_dictionaries({"messages": messages}, optional={
        "logprobs": st.just(True), "top_logprobs": st.integers(0, 5), "add_generation_prompt": st.booleans()})

    def merge(d: tuple[dict, dict]) -> dict:
        body = {**d[0], **d[1]}
        if "top_logprobs" in body:
            body["logprobs"] = True
        return body

    return st.tuples(_sampling(target, max_tokens), extra).map(merge)


def _valid_body(target: FuzzTarget, max_tokens: st.SearchStrategy[int]) -> st.SearchStrategy[tuple[str, dict]]:
    return st.one_of(st.tuples(st.just("/v1/completions"), _completion(target, max_tokens)),
                     st.tuples(st.just("/v1/chat/completions"), _chat(target, max_tokens)))


def _post(kind: str, path: str, body: dict, **fields: object) -> FuzzCase:
    return FuzzCase(kind, "POST", path, to_json(body).encode("utf-8"), stream=body.get("stream") is True,
                    **fields)  # type: ignore[arg-type]


# ---- hostile values ---------------------------------------------------------------------------------

_BODY_LEVEL = [Raw("9" * 5000), Raw("-" + "1" * 4301), Raw("[" * 5000 + "]" * 5000),
               Raw('{"a":' * 3000 + "1" + "}" * 3000)]
_NUMBERS = [Raw("NaN"), Raw("Infinity"), Raw("-Infinity"), Raw("1e999"), Raw("-0"), Raw("1e-400"), Raw("4.0"),
            -1, 0, 1, 2**31 - 1, 2**31, INT64 - 1, INT64, 2**64, -INT64 - 1, 10**100, 1e308, -1e-300, 0.5]


def _hostile_value(target: FuzzTarget) -> st.SearchStrategy[object]:
    ids = [[target.vocab_size], [-1], [2**40], [0] * 1025, list(range(target.vocab_size - 2, target.vocab_size + 2))]
    return st.one_of(
        st.none(), st.booleans(), st.sampled_from(_NUMBERS), st.integers(-(2**70), 2**70),
        st.floats(), _hostile_text, st.lists(_hostile_text, max_size=70), st.sampled_from(ids),
        st.lists(st.integers(-5, target.vocab_size + 5), max_size=5), st.lists(st.lists(st.integers(0, 3)), max_size=3),
        st.dictionaries(_hostile_text, st.one_of(st.integers(), _hostile_text), max_size=3),
        st.integers(0, 2 * target.max_n + 2), st.integers(0, target.max_logprobs + 2),
        st.sampled_from([target.max_model_len, target.max_model_len + 1, target.vocab_size]))


def _hostile_message() -> st.SearchStrategy[object]:
    part = st.one_of(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "input_audio", ""]),
                                            "text": st.one_of(_hostile_text, st.integers())}),
                     st.just({"type": "image_url", "image_url": {"url": "http://x/y.png"}}), st.just({}))
    return st.one_of(
        st.fixed_dictionaries({"role": st.one_of(st.sampled_from(["tool", "function", "developer", "", "USER"]),
                                                 _hostile_text)},
                              optional={"content": st.one_of(st.none(), _hostile_text, st.lists(part, max_size=3)),
                                        "name": _hostile_text, "tool_calls": st.just([{"id": "1"}]),
                                        "tool_call_id": _hostile_text}),
        st.just({"content": "no role"}), _hostile_text, st.integers())


def _hostile_field(target: FuzzTarget, name: str) -> st.SearchStrategy[object]:
    if name == "messages":
        return st.one_of(st.lists(_hostile_message(), max_size=3), _hostile_value(target))
    if name == "prompt":  # big batches too: more sequences than max_num_seqs and --max-queue together
        many = st.sampled_from([["a"] * 200, [[1]] * 150, ["x" * 40] * 64])
        return st.one_of(many, _hostile_value(target), st.sampled_from(_BODY_LEVEL))
    if name in UNSUPPORTED_SET:
        return st.one_of(st.sampled_from([UNSUPPORTED_SET[name], UNSUPPORTED_OFF.get(name)]), _hostile_value(target))
    return st.one_of(_hostile_value(target), st.sampled_from(_BODY_LEVEL))


def _mutated(target: FuzzTarget) -> st.SearchStrategy[FuzzCase]:
    @st.composite
    def build(draw: st.DrawFn) -> FuzzCase:
        path, body = draw(_valid_body(target, st.integers(1, target.max_tokens)))
        names = sorted(set(body) | {"n", "seed", "max_tokens", "logprobs", "echo", "suffix", "best_of", "top_k",
                                    "min_tokens", "stop_token_ids", "stream_options", "max_completion_tokens",
                                    "top_logprobs", "messages", "prompt", "model", "temperature"})
        fields = draw(st.lists(st.sampled_from(names + list(UNSUPPORTED_SET) + ["metadata", "user", "unknown_x"]),
                               min_size=1, max_size=3, unique=True))
        values = {name: draw(_hostile_field(target, name)) for name in fields}
        one = len(fields) == 1 and values[fields[0]] not in _BODY_LEVEL
        return _post("mutated", path, {**body, **values}, field=fields[0] if one else None)

    return build()


# ---- malformed bodies, other endpoints, chaos ---------------------------------------------------------

def _malformed(target: FuzzTarget) -> st.SearchStrategy[FuzzCase]:
    @st.composite
    def build(draw: st.DrawFn) -> FuzzCase:
        path, body = draw(_valid_body(target, st.integers(1, target.max_tokens)))
        raw = to_json(body).encode()
        big = b'{"prompt": "' + b"a" * (target.max_body_bytes + 10) + b'"}'
        choice = draw(st.sampled_from([
            b"", raw[: draw(st.integers(0, max(0, len(raw) - 1)))], b"[]", b"null", b"1", b'"text"', b"\xff\xfe" + raw,
            b"\xef\xbb\xbf" + raw, raw + b"}", raw + b" trailing", raw.replace(b":", b"=", 1), big, b"{" * 100_000,
            b'{"\\ud800": 1, "prompt": "a"}', b'{"prompt": "a", "prompt": 7}', raw]))
        content_type = draw(st.sampled_from(["application/json", "text/plain", None,
                                             "application/x-www-form-urlencoded", "application/json; charset=latin-1"]))
        return FuzzCase("malformed", "POST", path, choice, content_type)

    return build()


_OTHER = [("GET", "/v1/models"), ("GET", "/health"), ("GET", "/metrics"), ("GET", "/v1/completions"),
          ("PUT", "/v1/chat/completions"), ("POST", "/v1/models"), ("GET", "/nope"), ("POST", "/v1/embeddings"),
          ("DELETE", "/v1/completions"), ("GET", "/v1/models/%ED%A0%80"), ("POST", "/v1/completions/")]


def _other() -> st.SearchStrategy[FuzzCase]:
    return st.sampled_from(_OTHER).map(lambda m: FuzzCase("other", m[0], m[1], b"" if m[0] != "POST" else b"{}"))


def _chaos(target: FuzzTarget) -> st.SearchStrategy[FuzzCase]:
    keys = st.one_of(st.sampled_from(["prompt", "messages", "model", "n", "max_tokens", "stream", "logprobs"]),
                     _hostile_text)
    body = st.dictionaries(keys, _hostile_value(target), max_size=6)
    path = st.sampled_from(["/v1/completions", "/v1/chat/completions"])
    return st.builds(lambda p, b: _post("chaos", p, b), path, body)


def _cancelled(target: FuzzTarget) -> st.SearchStrategy[FuzzCase]:
    def build(d: tuple[tuple[str, dict], float]) -> FuzzCase:
        (path, body), after = d
        return _post("cancelled", path, {**body, "ignore_eos": True}, cancel_after=after)

    return st.tuples(_valid_body(target, st.integers(16, 64)), st.floats(0.0, 0.3)).map(build)


def fuzz_cases(target: FuzzTarget) -> st.SearchStrategy[FuzzCase]:
    """One case of any kind, weighted: half mutations, a quarter valid, the rest hostile in other ways."""
    def valid(d: tuple[str, dict]) -> FuzzCase:
        return _post("valid", d[0], d[1])

    kinds = {"valid": _valid_body(target, st.integers(1, target.max_tokens)).map(valid),
             "cancelled": _cancelled(target), "mutated": _mutated(target), "chaos": _chaos(target),
             "malformed": _malformed(target), "other": _other()}
    weights = ["valid"] * 25 + ["cancelled"] * 5 + ["mutated"] * 50 + ["chaos"] * 5 + ["malformed"] * 10 + ["other"] * 5
    return st.sampled_from(weights).flatmap(lambda kind: kinds[kind])


def generate_cases(target: FuzzTarget, count: int, seed: int) -> list[FuzzCase]:
    """`count` cases drawn by hypothesis (its generate phase only: no shrinking, no example database)."""
    cases: list[FuzzCase] = []
    run = 0
    while len(cases) < count:
        @settings(max_examples=count - len(cases), database=None, phases=[Phase.generate], deadline=None,
                  suppress_health_check=list(HealthCheck))
        @hypothesis_seed(seed + run)
        @given(fuzz_cases(target))
        def collect(case: FuzzCase) -> None:
            cases.append(case)

        collect()
        run += 1
    return cases[:count]
