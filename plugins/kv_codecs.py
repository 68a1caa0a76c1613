"""Built-in KV page codecs: `identity`, and `bf16_planes`, lossless for 16-bit floats.

`bf16_planes` splits a page's 16-bit values into their two byte planes and deflates the high
one (sign and exponent, a handful of values in K and V) with zlib at level 1; the low plane
(mantissa bits, near random) is stored as it is. Measured on SmolLM2's pages here: 27% fewer
bytes, 2.5 ms to encode and 0.7 ms to decode a 368 KiB page. It trades store memory and
transfer for CPU: `EDGEFIRE_KV_STORE_CODEC=bf16_planes` turns it on (bench/disagg.py reports
both). A float32 pool's pages pass through it unchanged.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

from edgefire.runtime.engine.remote_kv.codec import IDENTITY, IdentityKVCodec
from edgefire.runtime.engine.remote_kv.page_format import PageLayout
from edgefire.runtime.plugins import hookimpl

_LEN = struct.Struct("<I")  # bytes of the deflated high plane


class BF16PlanesCodec:
    name = "bf16_planes"

    def encode(self, page: memoryview, layout: PageLayout) -> bytes | memoryview:
        if layout.dtype.itemsize != 2:
            return page
        planes = np.frombuffer(page, dtype=np.uint8).reshape(-1, 2)
        high = zlib.compress(planes[:, 1].tobytes(), 1)
        return b"".join((_LEN.pack(len(high)), high, planes[:, 0].tobytes()))

    def decode(self, data: memoryview, layout: PageLayout) -> bytearray | memoryview:
        if layout.dtype.itemsize != 2:
            return IDENTITY.decode(data, layout)
        count = layout.num_bytes // 2
        try:
            (high_len,) = _LEN.unpack_from(data)
            high = zlib.decompress(data[_LEN.size:_LEN.size + high_len])
        except (struct.error, zlib.error) as exc:
            raise ValueError(f"not a bf16_planes page: {exc}") from None
        low = data[_LEN.size + high_len:]
        if len(high) != count or len(low) != count:
            raise ValueError("a bf16_planes page of another size")
        page = bytearray(layout.num_bytes)
        planes = np.frombuffer(page, dtype=np.uint8).reshape(-1, 2)
        planes[:, 0] = np.frombuffer(low, dtype=np.uint8)
        planes[:, 1] = np.frombuffer(high, dtype=np.uint8)
        return page


@hookimpl
def edgefire_register_kv_codecs(register):
    register("identity", IdentityKVCodec)
    register("bf16_planes", BF16PlanesCodec)
