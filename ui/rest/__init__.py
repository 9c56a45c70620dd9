"""The JSON API (/api/v1) and /metrics, served beside the page on the same server (gradio runs on FastAPI)."""
