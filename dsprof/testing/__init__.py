"""Test support shipped with dsprof: generators of artifacts whose answers are known.

Nothing in the product imports this package; tests, benchmarks and users who
want known-answer inputs do.
"""
