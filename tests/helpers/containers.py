"""Little videos, and the DASH manifest and HLS playlist that name a video elsewhere (what a probe uploads)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

FRAMES = 34


def video(path: Path, codec: str = "libx264", frames: int = FRAMES, extra=()) -> Path:
    import imageio_ffmpeg

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = imageio_ffmpeg.write_frames(str(path), (64, 64), fps=16, codec=codec, macro_block_size=16,
                                         output_params=list(extra))
    writer.send(None)
    for i in range(frames):
        writer.send(np.full((64, 64, 3), i * 7, np.uint8).tobytes())
    writer.close()
    return path


def dash(secret: Path) -> str:
    return ('<?xml version="1.0"?>\n<MPD xmlns="urn:mpeg:dash:schema:mpd:2011" type="static" '
            'mediaPresentationDuration="PT2S" minBufferTime="PT1S" '
            'profiles="urn:mpeg:dash:profile:isoff-on-demand:2011"><Period><AdaptationSet mimeType="video/mp4">'
            '<Representation id="1" bandwidth="1000" codecs="avc1.64000a" width="64" height="64">'
            f'<BaseURL>{secret}</BaseURL><SegmentBase/></Representation></AdaptationSet></Period></MPD>')


def hls(secret: Path) -> str:
    return f"#EXTM3U\n#EXT-X-TARGETDURATION:3\n#EXTINF:2.1,\nfile://{secret}\n#EXT-X-ENDLIST\n"

