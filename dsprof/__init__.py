"""dsprof: profile a multi-rank LLM decode runtime and explain late decode steps.

The subpackages live in top-level folders of the repository (runtime/, profiler/,
analysis/, cli/) and are mapped onto this namespace by pyproject.toml.
"""

__version__ = "0.1.0"
