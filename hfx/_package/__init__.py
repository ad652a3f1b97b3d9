"""Packages for the pipelines people deploy with: a directory each consumer loads as it is."""
