"""What the gateway charges a stream: its usage event, or, for one cut short, what it relayed."""

from __future__ import annotations

from edgefire.gateway.usage import StreamMeter, Tokens

NATIVE = (b'data: {"response":"The"}\n\ndata: {"response":" cap"}\n\ndata: {"response":"ital"}'
          b'\n\n')
OPENAI = (b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
          b'data: {"choices":[{"delta":{"content":"Hi"}}]}\n\n'
          b'data: {"choices":[{"delta":{"content":"\\"there\\""}}]}\n\n')


def test_a_stream_cut_short_is_charged_what_it_relayed():
    meter = StreamMeter("42")  # events split across chunks anywhere
    meter.feed(NATIVE[:17])
    meter.feed(NATIVE[17:50])
    meter.feed(NATIVE[50:])
    assert meter.tokens(NATIVE) == Tokens(42, 3)


def test_openai_role_chunks_are_not_text_and_escapes_are():
    meter = StreamMeter(None)
    meter.feed(OPENAI)
    assert meter.tokens(OPENAI) == Tokens(0, 2)


def test_a_whole_stream_is_charged_its_usage_event():
    end = b'data: {"response":"","usage":{"prompt_tokens":7,"completion_tokens":3}}\n\n'
    meter = StreamMeter("7")
    meter.feed(NATIVE + end)
    assert meter.tokens(NATIVE + end) == Tokens(7, 3)
