"""Helpers that several test files use (imported from here, never from another test file)."""
