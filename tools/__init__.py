"""Helpers that the tests and the benchmark scripts share, outside the package (personalize/ does not import them):
browser.py serves the studio and drives it in headless Chromium."""
