"""Image files made for the checks: a little PNG whose header claims any size."""
from __future__ import annotations

import struct
import zlib


def png_claiming(width: int, height: int) -> bytes:
    """A valid little PNG whose IHDR claims ``width`` x ``height`` (nothing that size is ever allocated)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b""))
