"""Coroutines run to their end from a test, whatever event loop the worker process already runs."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor


def run_coroutine(coroutine):
    """``asyncio.run(coroutine)`` in a thread of its own: a worker process that has run the browser tests keeps
    Playwright's event loop running in its main thread, where ``asyncio.run`` refuses to start another."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()
