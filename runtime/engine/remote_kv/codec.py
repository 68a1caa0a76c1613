"""How a page's bytes are stored in a KV store: the KV codec contract, and the identity."""

from __future__ import annotations

from typing import Protocol

from edgefire.runtime.engine.remote_kv.page_format import PageLayout


class KVCodec(Protocol):
    """Lossless: decode(encode(page)) is the page, bit for bit. Codecs run on the KV tier's
    threads (encode on the writer, decode on a lookup), never on the compute thread."""

    name: str

    def encode(self, page: memoryview, layout: PageLayout) -> bytes | memoryview: ...

    def decode(self, data: memoryview, layout: PageLayout) -> bytearray | memoryview:
        """The page's bytes (a view of data where they are stored as they are); ValueError if
        data is no page of this codec and layout."""
        ...


class IdentityKVCodec:
    name = "identity"

    def encode(self, page: memoryview, layout: PageLayout) -> memoryview:
        return page

    def decode(self, data: memoryview, layout: PageLayout) -> memoryview:
        # The record's own bytes, not a copy: install copies them into the pool anyway, and a
        # copy here made a lookup write 34 MB more for a 1,488-token SmolLM2 prefix (AMX Xeon
        # VM: checking and copying its pages took 119-131 ms when the copies landed in newly
        # mapped memory, 20 ms when not; without the copy, 15-16 ms).
        if len(data) != layout.num_bytes:
            raise ValueError(f"a page is {layout.num_bytes} bytes, not {len(data)}")
        return data


IDENTITY = IdentityKVCodec()
