"""Which container a video file is, by its own first bytes, and the ffmpeg input options that open it as that alone.

ffmpeg picks its demuxer from a file's content, not its name: an uploaded "video.mp4" that is an HLS playlist or a
DASH manifest (text naming other files) makes it open the files it names, so a job could read a file the app never
serves into its result. Here a file is looked at first (a few bytes, nothing run): one of a short list of containers
that hold their frames themselves is opened with that demuxer forced and only local files allowed; anything else, a
playlist or manifest above all, is refused with a sentence saying what to upload instead.
"""
from __future__ import annotations

from pathlib import Path

from engine.errors import InputError

# Bytes read to tell a container (and, for a text file, what kind of list it is).
SNIFF_BYTES = 4096
# ISO base media (MP4, MOV, M4V, 3GP) files begin with one of these boxes: ffmpeg's "mov" demuxer reads them all.
ISO_BOXES = (b"ftyp", b"moov", b"mdat", b"wide", b"free", b"skip", b"pnot")
VIDEO_HINT = "upload an MP4 (H.264), WebM or MOV video"
# A text that lists other files, by how it begins or what it holds, and what it is called.
LISTS = ((b"#EXTM3U", "an HLS playlist (.m3u8)"), (b"<MPD", "a DASH manifest (.mpd)"),
         (b"ffconcat", "an ffmpeg concat list"), (b"<?xml", "an XML file (a DASH manifest or a playlist)"),
         (b"[playlist]", "a playlist (.pls)"), (b"#EXTINF", "a playlist"))


class NotAContainer(InputError):
    """The file is no video container the app opens; the message names it and says what to upload."""


def container(path: Path | str, label: str | None = None) -> str:
    """ffmpeg's demuxer for the video file at ``path`` ("mov", "matroska", "avi" or "gif"), told from its first
    bytes; NotAContainer naming it (``label``: how to name it, default its file name) otherwise."""
    path = Path(path)
    label = label or repr(path.name)
    with open(path, "rb") as file:
        start = file.read(SNIFF_BYTES)
    if len(start) >= 8 and start[4:8] in ISO_BOXES:
        return "mov"
    if start.startswith(b"\x1a\x45\xdf\xa3"):
        return "matroska"
    if start[:4] == b"RIFF" and start[8:12] == b"AVI ":
        return "avi"
    if start[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    text = start.lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    for mark, kind in LISTS:
        if text.startswith(mark.lower()) or (mark == b"<MPD" and mark.lower() in text):
            raise NotAContainer(f"{label} is {kind}, which names other files for the video instead of holding it: "
                                f"the app does not open the files such a list names; {VIDEO_HINT} itself")
    raise NotAContainer(f"{label} is not a readable video: its contents are no MP4, MOV, WebM, MKV, AVI or GIF, "
                        f"whatever its name; {VIDEO_HINT}")


def input_options(path: Path | str, label: str | None = None) -> list[str]:
    """ffmpeg's options before ``-i path``: the demuxer its bytes say (``container``), and local files only."""
    return ["-f", container(path, label), "-protocol_whitelist", "file"]
