"""Pure renderers (no gradio): what the page says about a job, a plan, presets, history, timings."""
