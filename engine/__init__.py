"""The generation engine: one managed Wan pipeline, typed progress events, atomic outputs.

Nothing in this package probes the GPU or imports torch at import time.
"""
__version__ = "0.1.0"
APP_NAME = "Wan Studio"   # how the page and the console name the app
APP_ID = "wan-studio"     # how its files name it: sidecar["app"]["name"], by which the history knows its outputs
