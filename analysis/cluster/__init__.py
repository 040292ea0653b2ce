"""The same analysis on a Ray cluster."""
