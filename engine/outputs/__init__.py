"""The files of an output: atomic writes, video and sidecar, latents, kept inputs, history."""
