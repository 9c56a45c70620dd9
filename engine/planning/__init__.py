"""The memory plan, a pure function of model, request and hardware (no torch)."""
