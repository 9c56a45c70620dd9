"""What a job asks for: its settings, prompts and images, presets, and the checks they pass."""
