"""The order of VAE decode fallbacks after an out-of-memory error."""
from __future__ import annotations

from engine.planning.memory import VAE_TILES
from engine.run.decoding import decode_attempts


def test_a_device_decode_falls_back_to_smaller_tiles_then_the_cpu():
    largest, smaller = VAE_TILES[0], VAE_TILES[1]
    assert decode_attempts(None, "cuda", VAE_TILES) == [
        ("as planned", None, "cuda"), ("tiled", largest, "cuda"), ("on the CPU", largest, "cpu")]
    assert decode_attempts(largest, "cuda", VAE_TILES) == [
        ("as planned", largest, "cuda"), ("tiled", smaller, "cuda"), ("on the CPU", smaller, "cpu")]


def test_on_the_cpu_only_smaller_tiles_are_left_to_try():
    assert decode_attempts(None, "cpu", VAE_TILES) == [("as planned", None, "cpu"), ("tiled", VAE_TILES[0], "cpu")]
    smallest = VAE_TILES[-1]
    assert decode_attempts(smallest, "cpu", VAE_TILES) == [("as planned", smallest, "cpu")]
    assert decode_attempts(smallest, "cuda", VAE_TILES) == [
        ("as planned", smallest, "cuda"), ("tiled", smallest, "cuda"), ("on the CPU", smallest, "cpu")]
