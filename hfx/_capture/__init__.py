"""Capture: a model and its inputs, the named dynamic axes, and the record of what generate() runs."""
