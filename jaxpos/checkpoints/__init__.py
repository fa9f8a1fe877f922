"""Checkpoint import and export."""
