"""How a page's bytes are stored in a KV store: the KV codec contract, and the identity."""

from __future__ import annotations

from typing import Protocol

from edgefire.runtime.engine.remote_kv.page_format import PageLayout


class KVCodec(Protocol):
    """Lossless: decode(encode(page)) is the page, bit for bit. Codecs run on the KV tier's
    threads (encode on the writer, decode on a lookup), never on the compute thread."""

    name: str

    def encode(self, page: memoryview, layout: PageLayout) -> bytes | memoryview: ...

    def decode(self, data: memoryview, layout: PageLayout) -> bytearray:
        """The page's bytes; ValueError if data is no page of this codec and layout."""
        ...


class IdentityKVCodec:
    name = "identity"

    def encode(self, page: memoryview, layout: PageLayout) -> memoryview:
        return page

    def decode(self, data: memoryview, layout: PageLayout) -> bytearray:
        if len(data) != layout.num_bytes:
            raise ValueError(f"a page is {layout.num_bytes} bytes, not {len(data)}")
        return bytearray(data)


IDENTITY = IdentityKVCodec()
