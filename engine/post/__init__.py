"""Steps after a video is written: frame interpolation and upscaling."""
