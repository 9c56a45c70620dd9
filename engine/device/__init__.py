"""This machine: hardware detection, the device's clock and memory, what the engine holds."""
