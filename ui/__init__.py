"""The Gradio page. Only this package imports gradio; the engine never does."""
