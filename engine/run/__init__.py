"""A job on the loaded pipeline: the Engine, applying a plan, decoding, preview, schedulers, failures."""
