"""Trace-driven simulation that runs the same policy objects as the coordinator."""
