"""The files of an output: the bundle that names them, atomic writes, video and sidecar, latents, kept inputs,
history."""
