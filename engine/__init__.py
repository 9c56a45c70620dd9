"""The generation engine: one managed Wan pipeline, typed progress events, atomic outputs.

Nothing in this package probes the GPU or imports torch at import time.
"""
__version__ = "0.1.0"
APP_NAME = "Wan Studio"
