"""The engine in its own process, its watchdog, and the queue in front of it."""
