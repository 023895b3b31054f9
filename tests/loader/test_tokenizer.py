"""Tokenizer against HF AutoTokenizer on the same files: real tokenizers trained here, written to tmp dirs."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from lamina.loader.tokenizer import Tokenizer

CORPUS = ["the quick brown fox jumps over the lazy dog. hello world, hello there!"] * 30 + [
    "héllo wörld 日本語 emoji 🙂 café naïve 中文 ✓"]
TEXTS = ["hello world", "héllo wörld 日本語 emoji 🙂", "  two leading spaces", "", "tabs\tand\nnewlines!",
         "unseen 字 chars ✓ ß", "<|im_start|>user\nhi<|im_end|>", "<s>the fox</s>"]
CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]


def train_byte_level(specials: list[str]) -> BackendTokenizer:
    """GPT-2/Qwen/Llama-3-style byte-level BPE, small enough that multi-byte chars span several tokens."""
    tok = BackendTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=specials, show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def write_model_dir(path: Path, backend: BackendTokenizer, config: dict, generation: dict | None = None) -> str:
    path.mkdir(parents=True, exist_ok=True)
    backend.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                            **config}))
    if generation is not None:
        (path / "generation_config.json").write_text(json.dumps(generation))
    return str(path)


def chatml_dir(path: Path) -> str:
    """Qwen-style: no BOS, eos <|im_end|>, generation_config adds <|endoftext|>."""
    backend = train_byte_level(CHATML_SPECIALS)
    return write_model_dir(path, backend, {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                                           "bos_token": None},
                           {"eos_token_id": [2, 0]})


def llama3_dir(path: Path) -> str:
    """Llama-3-style: byte-level BPE + a TemplateProcessing post-processor that prepends BOS."""
    backend = train_byte_level(LLAMA3_SPECIALS)
    backend.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", 0)])
    return write_model_dir(path, backend, {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
                           {"eos_token_id": 1})


def llama2_backend() -> BackendTokenizer:
    """SentencePiece-style BPE (Llama-2/Mistral): Metaspace, byte fallback <0xNN>, BOS post-processor."""
    trained = BackendTokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    trained.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=200, show_progress=False))
    model = json.loads(trained.to_str())["model"]
    keep = [t for t in model["vocab"] if t.replace("▁", "").isascii()]  # non-ASCII must use byte fallback
    vocab = {t: i for i, t in enumerate(["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *keep])}
    merges = [(a, b) for a, b in model["merges"] if a in vocab and b in vocab and a + b in vocab]
    tok = BackendTokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True,
                                      byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    return tok


def llama2_dir(path: Path, **config: object) -> str:
    return write_model_dir(path, llama2_backend(), {"bos_token": "<s>", "eos_token": "</s>",
                                                    "unk_token": "<unk>", **config})


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("tok")
    return {"chatml": chatml_dir(root / "chatml"), "llama3": llama3_dir(root / "llama3"),
            "llama2": llama2_dir(root / "llama2"),
            # transformers 5 ignores add_bos_token whenever tokenizer.json exists: the post-processor rules
            "llama2_no_bos_cfg": llama2_dir(root / "llama2_nobos", add_bos_token=False, add_eos_token=True)}


@pytest.fixture(scope="module")
def hf_auto() -> type:
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer


@pytest.mark.parametrize("kind", ["chatml", "llama3", "llama2", "llama2_no_bos_cfg"])
def test_encode_decode_match_hf(model_dirs: dict[str, str], hf_auto: type, kind: str) -> None:
    ours = Tokenizer.from_pretrained(model_dirs[kind])
    hf = hf_auto.from_pretrained(model_dirs[kind])
    for text in TEXTS:
        for add in (True, False):
            ids = ours.encode(text, add_special_tokens=add)
            assert ids == hf.encode(text, add_special_tokens=add), (text, add)
            for skip in (True, False):
                assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
    assert ours.vocab_size == len(hf)
    assert ours.bos_token_id == hf.bos_token_id
    assert ours.eos_token_id == hf.eos_token_id
    assert set(hf.all_special_ids) <= set(ours.all_special_ids)
    ids = ours.encode("hello wörld")
    assert ours.convert_ids_to_tokens(ids) == hf.convert_ids_to_tokens(ids)
    assert ours.convert_ids_to_tokens(ids[0]) == hf.convert_ids_to_tokens(ids[0])


def test_bos_follows_post_processor(model_dirs: dict[str, str]) -> None:
    llama3 = Tokenizer.from_pretrained(model_dirs["llama3"])
    assert llama3.encode("hi")[0] == llama3.bos_token_id == 0
    assert llama3.encode("hi", add_special_tokens=False)[0] != 0
    chatml = Tokenizer.from_pretrained(model_dirs["chatml"])
    assert chatml.bos_token_id is None
    assert chatml.encode("hi") == chatml.encode("hi", add_special_tokens=False)


def test_byte_level_splits_multibyte_chars(model_dirs: dict[str, str]) -> None:
    tok = Tokenizer.from_pretrained(model_dirs["chatml"])
    ids = tok.encode("日本語 🙂")
    assert len(ids) > 4 and any("\ufffd" in tok.decode([i]) for i in ids)
    llama2 = Tokenizer.from_pretrained(model_dirs["llama2"])
    assert "<0xE6>" in llama2.convert_ids_to_tokens(llama2.encode("日"))


def test_eos_token_ids_union(model_dirs: dict[str, str], tmp_path: Path) -> None:
    chatml = Tokenizer.from_pretrained(model_dirs["chatml"])
    assert chatml.eos_token_id == 2
    assert chatml.eos_token_ids == frozenset({0, 2})
    assert Tokenizer.from_pretrained(model_dirs["llama3"]).eos_token_ids == frozenset({1, 2})
    assert Tokenizer.from_pretrained(model_dirs["llama2"]).eos_token_ids == frozenset({2})
    # config.json is the fallback when there is no generation_config.json
    path = llama2_dir(tmp_path / "cfg")
    (tmp_path / "cfg" / "config.json").write_text(json.dumps({"eos_token_id": [7, 8]}))
    assert Tokenizer.from_pretrained(path).eos_token_ids == frozenset({2, 7, 8})


def test_special_tokens_from_config_are_added(tmp_path: Path, hf_auto: type) -> None:
    path = llama2_dir(tmp_path / "m", additional_special_tokens=["<tool>"], pad_token="<pad>")
    ours, hf = Tokenizer.from_pretrained(path), hf_auto.from_pretrained(path)
    assert ours.vocab_size == len(hf)
    assert ours.pad_token_id == hf.pad_token_id == ours.token_to_id("<pad>")
    assert ours.encode("a<tool>b") == hf.encode("a<tool>b")
    assert ours.decode(ours.encode("a<tool>b")) == hf.decode(hf.encode("a<tool>b"), skip_special_tokens=True)
    assert ours.token_to_id("<tool>") in ours.all_special_ids


def test_truncation_in_tokenizer_json_is_ignored(tmp_path: Path) -> None:
    backend = llama2_backend()
    backend.enable_truncation(max_length=4)
    path = write_model_dir(tmp_path / "m", backend, {"bos_token": "<s>"})
    assert len(Tokenizer.from_pretrained(path).encode("the quick brown fox jumps over the lazy dog")) > 4


def test_missing_tokenizer_json_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="skip_tokenizer_init=True"):
        Tokenizer.from_pretrained(str(tmp_path))
    with pytest.raises(ValueError, match="does not exist"):
        Tokenizer.from_pretrained(str(tmp_path / "nope"))


def test_bad_config_files_are_clear_errors(tmp_path: Path) -> None:
    path = llama2_dir(tmp_path / "m")
    (tmp_path / "m" / "generation_config.json").write_text(json.dumps({"eos_token_id": "x"}))
    with pytest.raises(ValueError, match="generation_config.json: eos_token_id"):
        Tokenizer.from_pretrained(path)
    (tmp_path / "m" / "generation_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="generation_config.json is not valid JSON"):
        Tokenizer.from_pretrained(path)
    (tmp_path / "m" / "tokenizer.json").write_text("{}")
    with pytest.raises(ValueError, match="cannot read"):
        Tokenizer.from_pretrained(path)
